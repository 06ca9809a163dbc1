"""Mounting and unmounting, and reading what is mounted (``/proc/self/mountinfo``).

``mount(2)``/``umount2(2)`` are called directly (no ``mount`` process per task start).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from pathlib import Path

MNT_DETACH = 2

_libc: ctypes.CDLL | None = None


class MountError(OSError):
    pass


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def escape_option(path: Path) -> str:
    """A path as overlayfs reads it inside its option string (',' ':' and '\\' are escaped)."""
    return str(path).replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def mount_overlay(target: Path, lowers: list[Path], upper: Path, work: Path) -> None:
    """Mount an overlay at ``target``. ``lowers`` is newest first, as overlayfs wants it.

    redirect_dir and metacopy are off so the upper directory alone holds every changed file's
    full content: a finished layer is self-contained and can be read, diffed or stacked alone.
    """
    options = (
        f"lowerdir={':'.join(escape_option(p) for p in lowers)},upperdir={escape_option(upper)},"
        f"workdir={escape_option(work)},redirect_dir=off,metacopy=off,index=off,xino=off"
    )
    data = options.encode()
    if len(data) >= 4096:  # mount(2) takes one page of options
        raise MountError(errno.E2BIG, f"overlay options are {len(data)} bytes; lower the compaction depth")
    rc = _lib().mount(b"overlay", str(target).encode(), b"overlay", 0, data)
    if rc != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"mounting the overlay at {target} failed: {os.strerror(err)}")


def unmount(target: Path) -> bool:
    """Detach ``target`` (lazily, so a process still inside cannot keep it mounted). False if it
    was not mounted."""
    rc = _lib().umount2(str(target).encode(), MNT_DETACH)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOENT):
        return False
    raise MountError(err, f"unmounting {target} failed: {os.strerror(err)}")


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_under(prefix: Path) -> list[Path]:
    """Mount points at or below ``prefix``, deepest first (the order to unmount them in)."""
    root = str(prefix).rstrip("/")
    found: list[Path] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found  # not Linux: nothing can be mounted by this box
    for line in lines:
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == root or point.startswith(root + "/"):
            found.append(Path(point))
    found.sort(key=lambda p: len(p.parts), reverse=True)
    return found


def unmount_all_under(prefix: Path) -> int:
    count = 0
    for point in mounts_under(prefix):
        # a mount stacked on the same point shows up once per layer; unmount until it is gone
        while unmount(point):
            count += 1
    return count


def is_mounted(target: Path) -> bool:
    return any(point == target for point in mounts_under(target))


# --- id-mapped lower layers (the new mount API: open_tree, mount_setattr, move_mount) ---------
# x86_64 and aarch64 share these numbers (the generic syscall table).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x100000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise MountError(err, f"{what}: {os.strerror(err)}")
    return result


def attach_idmapped(source: Path, target: Path, userns_fd: int) -> None:
    """Mount ``source`` read-only at ``target``, its owner's files shown as the ids ``userns_fd``
    maps them to. A lower layer mounted so lets a task's own user change files root owns on
    disk (through copy-up), while the disk keeps root's ids."""
    libc = _lib()
    fd = _check(libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | os.O_CLOEXEC),
                f"open_tree {source}")
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, userns_fd)
        _check(libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
               f"id-map {source}")
        target.mkdir(parents=True, exist_ok=True)
        _check(libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
               f"attach {source} at {target}")
    finally:
        os.close(fd)

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
    options = (f"lowerdir={':'.join(escape_option(p) for p in lowers)},upperdir={escape_option(upper)},"
               f"workdir={escape_option(work)},{','.join(f'{key}={value}' for key, value in _OVERLAY_FEATURES)}")
    data = options.encode()
    if len(data) >= 4096:  # mount(2) takes one page of options
        raise MountError(errno.E2BIG, f"overlay options are {len(data)} bytes; lower the compaction depth")
    rc = _lib().mount(b"overlay", str(target).encode(), b"overlay", 0, data)
    if rc != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"mounting the overlay at {target} failed: {os.strerror(err)}")


_OVERLAY_FEATURES = (("redirect_dir", "off"), ("metacopy", "off"), ("index", "off"), ("xino", "off"))

MS_BIND = 0x1000


def bind(source: Path, target: Path) -> None:
    """Mount ``source`` (a directory) at ``target`` as well."""
    rc = _lib().mount(str(source).encode(), str(target).encode(), None, MS_BIND, None)
    if rc != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"binding {source} at {target} failed: {os.strerror(err)}")


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
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mount_table() -> str:
    try:
        with open("/proc/self/mountinfo", "rb") as handle:
            return handle.read().decode("utf-8", "surrogateescape")
    except OSError:
        return ""  # not Linux: nothing can be mounted by this box


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def mounts_under(*prefixes: Path) -> list[Path]:
    """Mount points at or below each of ``prefixes``, deepest first (the order to unmount them
    in), the first prefix's before the next's; from one reading of the mount table."""
    table = _mount_table()
    roots = [str(prefix).rstrip("/") for prefix in prefixes]
    roots = [root for root in roots if _escape(root) in table]  # most questions find nothing
    if not roots:
        return []
    found: list[list[Path]] = [[] for _ in roots]
    for line in table.splitlines():
        fields = line.split(" ", 5)
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        for index, root in enumerate(roots):
            if point == root or point.startswith(root + "/"):
                found[index].append(Path(point))
                break
    for points in found:
        points.sort(key=lambda p: len(p.parts), reverse=True)
    return [point for points in found for point in points]


def unmount_all_under(*prefixes: Path) -> int:
    count = 0
    for point in mounts_under(*prefixes):
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
_AT_SYMLINK_NOFOLLOW = 0x100
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


def _make_dir(path: Path) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.mkdir(parents=True, exist_ok=True)


def clone_idmapped(source: Path | str, *, userns_fd: int | None = None, at: int = _AT_FDCWD) -> int:
    """A detached read-only copy of the directory ``source`` (relative to the detached mount
    ``at`` when given), without what is mounted below it: a file descriptor the caller closes.
    With ``userns_fd``, its owner's files are shown as the ids that namespace maps them to; a
    copy made from such a copy (``at``) keeps its id-map. A lower layer mounted so lets a task's
    own user change files root owns on disk (through copy-up), while the disk keeps root's ids."""
    libc = _lib()
    fd = _check(libc.syscall(_SYS_OPEN_TREE, at, os.fsencode(source), _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_SYMLINK_NOFOLLOW),
                f"open_tree {source}")
    if userns_fd is None:
        return fd
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, userns_fd)
        _check(libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
               f"id-map {source}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def attach_idmapped(source: Path, target: Path, userns_fd: int) -> None:
    """Mount ``source`` read-only at ``target``, id-mapped (``clone_idmapped``): a kernel without
    overlay layers given by file descriptor (``mount_overlay_layers``) stacks such mounts."""
    fd = clone_idmapped(source, userns_fd=userns_fd)
    try:
        _make_dir(target)
        _check(_lib().syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
               f"attach {source} at {target}")
    finally:
        os.close(fd)


# --- an overlay whose lower layers are given by file descriptor (fsopen, fsconfig, fsmount) ---
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_FSOPEN_CLOEXEC = 1
_FSMOUNT_CLOEXEC = 1
_FSCONFIG_SET_STRING = 1
_FSCONFIG_SET_FD = 5
_FSCONFIG_CMD_CREATE = 6


def mount_overlay_layers(target: Path, lower_fds: list[int], upper: Path, work: Path) -> None:
    """Mount an overlay at ``target`` whose lower layers (newest first) are the detached mounts
    ``lower_fds`` (``clone_idmapped``): nothing of them is mounted on the host, so there is
    nothing to unmount but the view, and no layer's path is in the view's mount options (each
    shows as ``/``). Needs Linux 6.15 or later (``overlay.layers_by_fd_refusal``)."""
    libc = _lib()
    context = _check(libc.syscall(_SYS_FSOPEN, b"overlay", _FSOPEN_CLOEXEC), "fsopen overlay")
    try:
        for fd in lower_fds:
            _check(libc.syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_FD, b"lowerdir+", None, fd), "a lower layer by descriptor")
        for key, value in (("upperdir", str(upper)), ("workdir", str(work)), *_OVERLAY_FEATURES):
            _check(libc.syscall(_SYS_FSCONFIG, context, _FSCONFIG_SET_STRING, key.encode(), os.fsencode(value), 0), key)
        _check(libc.syscall(_SYS_FSCONFIG, context, _FSCONFIG_CMD_CREATE, None, None, 0), f"the overlay at {target}")
        mount = _check(libc.syscall(_SYS_FSMOUNT, context, _FSMOUNT_CLOEXEC, 0), f"fsmount {target}")
        try:
            _check(libc.syscall(_SYS_MOVE_MOUNT, mount, b"", _AT_FDCWD, os.fsencode(target), _MOVE_MOUNT_F_EMPTY_PATH),
                   f"attach the overlay at {target}")
        finally:
            os.close(mount)
    finally:
        os.close(context)


# --- loop devices (a task's disk image, tasks.layers.disk) ------------------------------------
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID, MS_NODEV = 0x2, 0x4


class _LoopInfo64(ctypes.Structure):
    _fields_ = [("lo_device", ctypes.c_uint64), ("lo_inode", ctypes.c_uint64), ("lo_rdevice", ctypes.c_uint64),
                ("lo_offset", ctypes.c_uint64), ("lo_sizelimit", ctypes.c_uint64), ("lo_number", ctypes.c_uint32),
                ("lo_encrypt_type", ctypes.c_uint32), ("lo_encrypt_key_size", ctypes.c_uint32),
                ("lo_flags", ctypes.c_uint32), ("lo_file_name", ctypes.c_uint8 * 64),
                ("lo_crypt_name", ctypes.c_uint8 * 64), ("lo_encrypt_key", ctypes.c_uint8 * 32),
                ("lo_init", ctypes.c_uint64 * 2)]


class _LoopConfig(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_uint32), ("block_size", ctypes.c_uint32), ("info", _LoopInfo64),
                ("reserved", ctypes.c_uint64 * 8)]


def attached_loop(image: Path) -> str | None:
    """The loop device ``image`` is already attached to (a mount lazily detached but still
    busy), so mounting it again shares that filesystem instead of opening it twice."""
    wanted = os.path.realpath(image)
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as handle:
                backing = handle.read().strip()
        except OSError:
            continue
        if backing == wanted:
            return f"/dev/{name}"
    return None


def mount_image(image: Path, target: Path, options: str = "discard") -> None:
    """Mount the ext4 filesystem in ``image`` at ``target`` (nosuid, nodev) through a loop
    device that goes away with the mount (autoclear)."""
    libc = _lib()
    device = attached_loop(image)
    loop_fd = -1
    if device is not None:
        # Held open until the mount has it: a device whose last user goes between finding it
        # and mounting it is cleared by autoclear (mounting it then fails with EIO) and may be
        # given to another image. Checked again once held.
        try:
            loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            device = None
        else:
            if attached_loop(image) != device:
                os.close(loop_fd)
                loop_fd, device = -1, None
    if device is None:
        image_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
            try:
                for _ in range(64):  # another process may take the free device first
                    number = _check(libc.ioctl(control, _LOOP_CTL_GET_FREE), "finding a free loop device")
                    device = f"/dev/loop{number}"
                    loop_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                    config = _LoopConfig(fd=image_fd)
                    config.info.lo_flags = _LO_FLAGS_AUTOCLEAR
                    if libc.ioctl(loop_fd, _LOOP_CONFIGURE, ctypes.byref(config)) == 0:
                        break
                    err = ctypes.get_errno()
                    os.close(loop_fd)
                    loop_fd = -1
                    if err != errno.EBUSY:
                        raise MountError(err, f"attaching {image} to {device}: {os.strerror(err)}")
                else:
                    raise MountError(errno.EBUSY, f"no free loop device for {image}")
            finally:
                os.close(control)
        finally:
            os.close(image_fd)
    try:
        rc = libc.mount(str(device).encode(), str(target).encode(), b"ext4", MS_NOSUID | MS_NODEV, options.encode())
        if rc != 0:
            err = ctypes.get_errno()
            raise MountError(err, f"mounting {image} at {target} failed: {os.strerror(err)}")
    finally:
        if loop_fd >= 0:
            os.close(loop_fd)  # the mount holds the device now; autoclear frees it after the last unmount

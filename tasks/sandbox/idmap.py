"""Detached (and optionally id-mapped) copies of a directory tree, for a task's mount namespace.

A task's view belongs to root on disk; the task's user must be able to change it. Instead of
chown-ing every file (slow, and wrong once the user is gone), the view is shown to the sandbox
through an *id-mapped* mount: files root owns on disk appear as owned by the task's user, and
files the task creates land on disk as root's. Only the sandbox's own mount namespace sees this.

``clone_tree`` returns a file descriptor of a detached mount; the sandbox's init attaches it with
``move_mount`` inside its namespace, so nothing is ever mounted on the host and nothing needs
unmounting when the task ends.

Overlayfs cannot be id-mapped itself; a layer driver that wants the same effect id-maps its lower
layers with ``clone_tree`` (any plain directory works) and gives the upper directory to the user.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path

from tasks.sandbox.accounts import SandboxError

# x86_64 and aarch64 share these (the new mount API is in the generic syscall table).
_SYS_OPEN_TREE = 428
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str, path: Path) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} {path}: {os.strerror(err)}")
    return result


# One user namespace per id-map, kept open for the life of the process: making one starts two
# processes (``unshare``, ``sh``), and a view's opening needs one at every task start; the pool
# hands out the same few uids again and again (``tasks.sandbox.users``). A namespace holds no
# process and no privilege of its own: it only says which ids an id-mapped mount shows.
_KEPT_MAPPINGS = 32
_mappings: dict[tuple[int, int, int, int], int] = {}
_mappings_pid = 0
_mappings_lock = threading.Lock()


def userns_mapping(uid: int, gid: int, disk_uid: int = 0, disk_gid: int = 0) -> int:
    """A user namespace fd mapping ``disk_uid``/``disk_gid`` (ids as stored on disk) to
    ``uid``/``gid``: the id-map for an id-mapped mount. The caller closes it.

    The same map gives the same namespace again (a copy of the fd this process keeps, at most
    ``_KEPT_MAPPINGS`` of them: the oldest is let go first)."""
    global _mappings_pid
    key = (uid, gid, disk_uid, disk_gid)
    with _mappings_lock:
        if _mappings_pid != os.getpid():  # a forked child: the parent's copies are not its to keep
            for fd in _mappings.values():
                os.close(fd)
            _mappings.clear()
            _mappings_pid = os.getpid()
        kept = _mappings.get(key)
        if kept is None:
            kept = _mappings[key] = _new_mapping(*key)
            while len(_mappings) > _KEPT_MAPPINGS:
                os.close(_mappings.pop(next(iter(_mappings))))
        return os.dup(kept)  # O_CLOEXEC, as ``os.dup`` makes every copy


def _new_mapping(uid: int, gid: int, disk_uid: int, disk_gid: int) -> int:
    """A namespace needs a process to be created in; a short-lived ``unshare`` provides it, and the
    namespace outlives it as long as the returned fd is open."""
    # The child says "in" once it runs inside its new namespace: only then can its maps be written.
    holder = subprocess.Popen(["unshare", "--user", "--", "sh", "-c", "echo in; read _"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        if holder.stdout.readline() != b"in\n":  # blocks until then; EOF means it never got there
            holder.kill()
            holder.wait()
            reason = holder.stderr.read().decode().strip() if holder.stderr else ""
            raise SandboxError(f"cannot create a user namespace: {reason}")
        Path(f"/proc/{holder.pid}/uid_map").write_text(f"{disk_uid} {uid} 1\n")
        Path(f"/proc/{holder.pid}/setgroups").write_text("deny\n")
        Path(f"/proc/{holder.pid}/gid_map").write_text(f"{disk_gid} {gid} 1\n")
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.kill()
        holder.wait()
        for stream in (holder.stdin, holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()


def clone_tree(source: Path, *, uid: int | None = None, gid: int | None = None, disk_uid: int = 0,
               disk_gid: int = 0, attrs: int = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) -> int:
    """A detached recursive bind of ``source`` with ``attrs``; with ``uid``, id-mapped so files
    owned by ``disk_uid`` on disk appear as ``uid``'s (and files ``uid`` creates land as
    ``disk_uid``'s).

    Raises ``OSError`` (EINVAL) when the filesystem cannot be id-mapped (overlayfs).
    """
    fd = _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source),
                              _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE), "open_tree", source)
    userns = -1
    try:
        if uid is not None:
            userns = userns_mapping(uid, gid if gid is not None else uid, disk_uid, disk_gid)
            attrs |= MOUNT_ATTR_IDMAP
        attr = _MountAttr(attrs, 0, 0, max(userns, 0))
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr),
                             ctypes.sizeof(attr)), "mount_setattr", source)
    except BaseException:
        os.close(fd)
        raise
    finally:
        if userns >= 0:
            os.close(userns)
    return fd

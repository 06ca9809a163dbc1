"""Copying a task's overlay upper out of its disk image (``tasks.layers.disk.settle``): as
``cp -a`` would, without a process when the upper is small and plain, and every file of the
task's user handed to root."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

MB = 1024 * 1024
# Task users' ids (tasks.sandbox.users): files they own in the layer are handed to root at settle.
TASK_IDS = range(200_000, 300_000)

SMALL_ENTRIES = 64
SMALL_BYTES = MB


def copy_small(source: Path, target: Path) -> bool:
    """Copy the upper ``source`` to ``target`` as ``cp -a`` would, without a process, when it is
    small and plain: directories, whole (not sparse) files with one link, symlinks and whiteouts
    (0/0 character devices), with owners, modes, xattrs (overlayfs's) and times. False, having
    written nothing, for anything else (``cp`` then keeps hard links and holes)."""
    entries: list[tuple[str, os.stat_result]] = []
    size = 0
    for current, dirs, files in os.walk(source):
        for name in (*dirs, *files):
            path = os.path.join(current, name)
            st = os.lstat(path)
            mode = st.st_mode
            if stat.S_ISREG(mode):
                if st.st_nlink != 1 or st.st_blocks * 512 < st.st_size:
                    return False
                size += st.st_size
            elif stat.S_ISLNK(mode):
                if os.listxattr(path, follow_symlinks=False):
                    return False
            elif not (stat.S_ISDIR(mode) or (stat.S_ISCHR(mode) and st.st_rdev == 0)):
                return False
            entries.append((path, st))
            if len(entries) > SMALL_ENTRIES or size > SMALL_BYTES:
                return False
    top = os.lstat(source)
    os.mkdir(target, 0o700)
    _copy_attributes(str(source), str(target), top)
    dirs_done: list[tuple[str, os.stat_result]] = [(str(target), top)]
    for path, st in entries:
        copy = os.path.join(target, os.path.relpath(path, source))
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(copy, 0o700)
            dirs_done.append((copy, st))
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(path), copy)
        elif stat.S_ISCHR(mode):
            os.mknod(copy, stat.S_IFCHR | 0o600, 0)
        else:
            with open(path, "rb") as src, open(copy, "xb") as dst:
                shutil.copyfileobj(src, dst)
        _copy_attributes(path, copy, st)
    for copy, st in reversed(dirs_done):  # a directory's times after its entries are written
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    return True


def _copy_attributes(path: str, copy: str, st: os.stat_result) -> None:
    """Owner first (a chown clears set-id bits and file capabilities), then mode, xattrs, times."""
    link = stat.S_ISLNK(st.st_mode)
    os.chown(copy, st.st_uid, st.st_gid, follow_symlinks=False)
    if link:
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        return
    os.chmod(copy, stat.S_IMODE(st.st_mode))
    for name in os.listxattr(path, follow_symlinks=False):
        os.setxattr(copy, name, os.getxattr(path, name, follow_symlinks=False), follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))


def give_to_root(root: Path) -> None:
    """Files a task's user created (the overlay upper is theirs while the task runs) become
    root's, as ``tasks.sandbox.cleanup.disown_files`` does for a layer on the data filesystem:
    a later task that gets the same recycled uid owns nothing here."""
    for current, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = os.path.join(current, name)
            st = os.lstat(path)
            if st.st_uid in TASK_IDS or st.st_gid in TASK_IDS:
                os.lchown(path, 0 if st.st_uid in TASK_IDS else st.st_uid, 0 if st.st_gid in TASK_IDS else st.st_gid)
    st = os.lstat(root)
    if st.st_uid in TASK_IDS or st.st_gid in TASK_IDS:
        os.lchown(root, 0, 0)

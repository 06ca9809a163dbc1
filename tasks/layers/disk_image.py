"""One ext4 filesystem in a sparse image file, as large as a task's disk limit: made, mounted,
and its free space beyond the limit taken by a ballast file (``tasks.layers.disk`` gives a task
one, keeps spares, and settles it at the seal)."""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from tasks.layers import mounts

MB = 1024 * 1024


BLOCK = 4096


BYTES_PER_INODE = 16 * 1024  # ext4's default ratio: a 1 GB limit allows 65536 new files


MIN_INODES = 1024


# The image is made this much larger than the limit (and the copy driver's working copy); the
# ballast then takes back all but the limit. ext4's own space (inode tables, journal, reserved
# clusters) must fit in it.
SLACK = 64 * MB


RESERVE = ".reserve"


# A spare's limit, written in its root when the spare is made: only an image that has one is
# emptied and used again after its task (``_recycle``); one a task made itself (for a working
# copy, or when no spare waited) is deleted.
LIMIT_FILE = ".limit"


# What an emptied image keeps: the ballast, the limit, and ext4's own directory.
KEPT_ENTRIES = frozenset({RESERVE, LIMIT_FILE, "lost+found"})


MKFS = "mkfs.ext4"


class DiskError(OSError):
    pass


def reason(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return (exc.stderr or b"").decode(errors="replace").strip() or f"{exc.cmd[0]} exited {exc.returncode}"
    return str(exc)


def make_image(image: Path, *, limit_mb: int, content_bytes: int, content_files: int) -> None:
    """A sparse image with an ext4 filesystem, large enough for the limit plus ``content`` (the
    copy driver's working copy) plus ext4's overhead; made aside and renamed into place."""
    limit = limit_mb * MB
    inodes = content_files + max(MIN_INODES, limit // BYTES_PER_INODE)
    size = content_bytes + limit + limit // 4 + inodes * 256 + SLACK
    size -= size % BLOCK
    partial = image.with_name(f".{image.name}.{os.getpid()}")
    try:
        with open(partial, "wb") as handle:
            handle.truncate(size)
        # -m 0: no blocks reserved for root (overlayfs writes as root); lazy init: nothing
        # written for the inode tables and journal, so making it costs milliseconds, not size.
        # ^resize_inode: the image never grows, so no blocks are set aside (and written) for it.
        # ^has_journal: a journal makes mounting and unmounting dearer (the image lives as long as
        # its task; after a crash it is checked with e2fsck before it is mounted again).
        subprocess.run([MKFS, "-q", "-F", "-b", str(BLOCK), "-m", "0", "-N", str(inodes), "-O", "^resize_inode,^has_journal",
                        "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", str(partial)],
                       check=True, capture_output=True, timeout=120)
        os.replace(partial, image)
    finally:
        partial.unlink(missing_ok=True)


def mount(image: Path, point: Path) -> None:
    """Loop-mount ``image`` at ``point`` (the loop device of an image still attached, by a lazily
    detached earlier mount, is reused: one image never gets two filesystems)."""
    point.mkdir(parents=True, exist_ok=True)
    mounts.mount_image(image, point)


def reserve_beyond(point: Path, limit_mb: int, used_bytes: int = 0) -> None:
    """Take every free block but ``limit_mb`` less ``used_bytes`` (what a retried task's layer
    already holds), once: an existing ballast is kept. Works through the mounted root itself, so
    an image unmounted meanwhile (``sweep``) never sends the ballast to the data filesystem."""
    root = os.open(point, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if os.fstat(root).st_dev == os.stat(point.parent).st_dev:
            raise DiskError(errno.ENODEV, f"no disk image is mounted at {point}")
        try:
            os.stat(RESERVE, dir_fd=root)
            return
        except FileNotFoundError:
            pass
        st = os.fstatvfs(root)
        extra = st.f_bavail * st.f_frsize - max(0, limit_mb * MB - used_bytes)
        if extra < 0:
            raise DiskError(errno.ENOSPC, f"the task's disk image has {st.f_bavail * st.f_frsize // MB} MB free, "
                                          f"less than its limit of {limit_mb} MB")
        partial = f"{RESERVE}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=root)
        try:
            if extra:
                os.posix_fallocate(fd, 0, extra)
        finally:
            os.close(fd)
        os.rename(partial, RESERVE, src_dir_fd=root, dst_dir_fd=root)
    finally:
        os.close(root)


def is_mount(point: Path) -> bool:
    """An image is mounted at ``point``: it is on another filesystem than its parent (two
    ``stat`` calls, where ``mounts.is_mounted`` reads every line of ``/proc/self/mountinfo``)."""
    try:
        return os.stat(point).st_dev != os.stat(point.parent).st_dev
    except FileNotFoundError:
        return False


def content_size(trees: list[Path]) -> tuple[int, int]:
    """Bytes and entries under ``trees``: more than a working copy made of them takes (a layer
    over another counts both), which costs nothing (the image is sparse)."""
    size = files = 0
    for tree in trees:
        for current, dirs, names in os.walk(tree):
            for name in (*dirs, *names):
                try:
                    st = os.lstat(os.path.join(current, name))
                except FileNotFoundError:
                    continue
                size += -(-st.st_size // BLOCK) * BLOCK + BLOCK  # its blocks, and a block of metadata
                files += 1
    return size, files

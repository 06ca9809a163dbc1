"""A task's disk limit: what it writes goes to a filesystem of its own, as large as the limit.

The data directory's filesystem cannot bound one directory (ext4 without project quota), so a
limited task's writable part lives on a small ext4 filesystem in a sparse image file,
``layers/<task>/disk.img``, loop-mounted at ``layers/<task>/disk/`` while the task is active:

    disk/upper/        the overlay upperdir
    disk/ovl-work/     the overlay workdir (same filesystem, as overlayfs requires)
    disk/view/         the copy driver's working copy (bound onto ``tasks/<task>/view``)
    disk/manifest*.json  the copy driver's record of what it copied
    disk/.reserve      ballast: all the free space but the limit, allocated without data

The kernel then refuses a write past the limit (``ENOSPC``) whatever the process does: one big
file, many small files (the image has a bounded number of inodes too), copy-ups of large files.
The ballast makes the limit exact without knowing ext4's own overhead in advance: the image is
made larger than needed, and after mounting, everything free beyond the limit is taken by one
``fallocate``d file (unwritten extents: no data, so the sparse image stays small). The image is
mounted with ``discard``: space a task frees is given back to the host.

At seal the layer's changes leave the image for ``layers/<task>/upper`` on the data filesystem,
where every other layer is, and the image is deleted (``settle``): a finished layer is read,
diffed, stacked, kept and undone exactly as before. The overlay upper is copied out before the
seal rewrites it; the copy driver's seal moves each changed file out of the working copy. The
copy costs what the task changed.

Where the image cannot be made (not root, no loop devices, no ``mkfs.ext4``) ``unavailable()``
says why; ``limits.disk_mb`` is then refused and ``/api/health`` says the disk is not bounded.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from tasks.layers import mounts, paths

MB = 1024 * 1024
BLOCK = 4096
BYTES_PER_INODE = 16 * 1024  # ext4's default ratio: a 1 GB limit allows 65536 new files
MIN_INODES = 1024
# The image is made this much larger than the limit (and the copy driver's working copy); the
# ballast then takes back all but the limit. ext4's own space (inode tables, journal, reserved
# clusters) must fit in it.
SLACK = 64 * MB
RESERVE = ".reserve"
MKFS = "mkfs.ext4"
# Task users' ids (tasks.sandbox.users): files they own in the layer are handed to root at settle.
TASK_IDS = range(200_000, 300_000)


class DiskError(OSError):
    pass


def image_path(task_id: str) -> Path:
    return paths.layer_dir(task_id) / "disk.img"


def mount_point(task_id: str) -> Path:
    return paths.layer_dir(task_id) / "disk"


@contextmanager
def _lock(task_id: str) -> Iterator[None]:
    """Orders mounting and unmounting one task's image across processes. Taken inside the layer
    lock when both are held, never around it."""
    fd = os.open(paths.lock_file("disks", task_id), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- can this box do it? -------------------------------------------------------------------

def unavailable() -> str | None:
    """None when a task's disk can be bounded here; otherwise why not. Probed once per process
    and data directory, with a real image made, mounted and filled past its limit."""
    return paths.probed("disk", _run_probe)


def _run_probe(data: Path) -> str | None:
    if os.geteuid() != 0:
        return "the box is not running as root (a loop-mounted filesystem per task needs it)"
    if shutil.which(MKFS) is None:
        return f"{MKFS} is not installed (Debian: e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "this kernel offers no loop devices (/dev/loop-control)"
    base = data / "layers" / f".disk-probe-{os.getpid()}-{threading.get_ident()}"
    image, point = base / "disk.img", base / "disk"
    try:
        point.mkdir(parents=True, exist_ok=True)
        _make_image(image, limit_mb=1, content_bytes=0, content_files=0)
        _mount(image, point)
        try:
            _reserve(point, 1)
            try:
                with open(point / "fill", "wb") as handle:
                    handle.write(b"x" * (2 * MB))
                    handle.flush()
                    os.fsync(handle.fileno())
                return "a write past the limit of a loop-mounted ext4 image was not refused"
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        finally:
            mounts.unmount(point)
        if settings.BOX_TASK_DISK_MB:
            make_spares(settings.BOX_TASK_DISK_MB)  # so the first tasks need not make their own
        return None
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"a loop-mounted ext4 image cannot be used on {data}: {_reason(exc)}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return (exc.stderr or b"").decode(errors="replace").strip() or f"{exc.cmd[0]} exited {exc.returncode}"
    return str(exc)


def describe() -> str:
    reason = unavailable()
    if reason is not None:
        return f"not enforced: {reason}"
    return "a loop-mounted ext4 image per task, sized to its limit (bytes and files)"


# --- the image -----------------------------------------------------------------------------

def _make_image(image: Path, *, limit_mb: int, content_bytes: int, content_files: int) -> None:
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
        # ^has_journal: mounting and unmounting cost a third (the image lives as long as its task;
        # after a crash it is checked with e2fsck before it is mounted again).
        subprocess.run([MKFS, "-q", "-F", "-b", str(BLOCK), "-m", "0", "-N", str(inodes), "-O", "^resize_inode,^has_journal",
                        "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", str(partial)],
                       check=True, capture_output=True, timeout=120)
        os.replace(partial, image)
    finally:
        partial.unlink(missing_ok=True)


def _mount(image: Path, point: Path) -> None:
    """Loop-mount ``image`` at ``point`` (the loop device of an image still attached, by a lazily
    detached earlier mount, is reused: one image never gets two filesystems)."""
    point.mkdir(parents=True, exist_ok=True)
    mounts.mount_image(image, point)


def _reserve(point: Path, limit_mb: int, used_bytes: int = 0) -> None:
    """Take every free block but ``limit_mb`` less ``used_bytes`` (what a retried task's layer
    already holds), once: an existing ballast is kept."""
    ballast = point / RESERVE
    if ballast.exists():
        return
    st = os.statvfs(point)
    extra = st.f_bavail * st.f_frsize - max(0, limit_mb * MB - used_bytes)
    if extra < 0:
        raise DiskError(errno.ENOSPC, f"the task's disk image has {st.f_bavail * st.f_frsize // MB} MB free, "
                                      f"less than its limit of {limit_mb} MB")
    partial = point / f"{RESERVE}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if extra:
            os.posix_fallocate(fd, 0, extra)
    finally:
        os.close(fd)
    os.rename(partial, ballast)


def limited(task_id: str) -> bool:
    """The task's writes go to a disk image of its own (it exists until the layer is settled)."""
    return image_path(task_id).exists()


def create(task_id: str, limit_mb: int, *, content_bytes: int = 0, content_files: int = 0) -> Path:
    """Make and mount the task's image (at its first start; then only mounted). Its mount point.
    An image with no working copy in it (the overlay driver's) comes from the spares made ahead."""
    image, point = image_path(task_id), mount_point(task_id)
    with _lock(task_id):
        if not image.exists():
            if content_bytes or not _take_spare(limit_mb, image):
                _make_image(image, limit_mb=limit_mb, content_bytes=content_bytes, content_files=content_files)
            if not content_bytes:
                make_spares(limit_mb)
        if not mounts.is_mounted(point):
            _mount(image, point)
    return point


# --- spares: images made ahead, off the task's start ---------------------------------------

SPARES = 2  # per limit, per data directory


def _spares_dir() -> Path:
    return paths.data_dir() / "layers" / ".disk-spares"  # a dot: never taken for a task's layer


def _take_spare(limit_mb: int, image: Path) -> bool:
    for spare in sorted(_spares_dir().glob(f"{limit_mb}-*.img")):
        try:
            os.rename(spare, image)  # atomic: of two processes one gets it
            return True
        except FileNotFoundError:
            continue
    return False


_making: set[tuple[str, int]] = set()
_making_lock = threading.Lock()


def make_spares(limit_mb: int) -> None:
    """Top up the spare images for ``limit_mb`` in the background (one maker per limit here)."""
    key = (str(paths.data_dir()), limit_mb)
    with _making_lock:
        if key in _making:
            return
        _making.add(key)
    directory = _spares_dir()

    def make() -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            while len(list(directory.glob(f"{limit_mb}-*.img"))) < SPARES:
                name = f"{limit_mb}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
                image, point = directory / f".{name}.making", directory / f".{name}.mount"
                try:
                    _make_image(image, limit_mb=limit_mb, content_bytes=0, content_files=0)
                    point.mkdir()
                    _mount(image, point)
                    try:
                        _reserve(point, limit_mb)  # the ballast too: allocating it is most of a start's cost
                    finally:
                        while mounts.unmount(point):
                            pass
                    os.rename(image, directory / f"{name}.img")
                finally:
                    image.unlink(missing_ok=True)
                    if point.is_dir():
                        point.rmdir()
        except (OSError, subprocess.SubprocessError):
            pass  # a task then makes its own image, as without spares
        finally:
            with _making_lock:
                _making.discard(key)

    threading.Thread(target=make, name="layers-disk-spares", daemon=True).start()


def mounted(task_id: str) -> Path | None:
    """The mount point of the task's image, mounted again if a restart unmounted it; None when
    the task has no image (no limit, or its layer is settled)."""
    image, point = image_path(task_id), mount_point(task_id)
    if not image.exists():
        return None
    if mounts.is_mounted(point):
        return point
    with _lock(task_id):
        if not image.exists():
            return None
        if not mounts.is_mounted(point):
            # not mounted since a restart (or a crash): a filesystem without a journal is checked
            # first (-p: repairs what is safe, fails on anything else)
            subprocess.run(["e2fsck", "-p", str(image)], capture_output=True, timeout=300)
            _mount(image, point)
    return point


def reserve(task_id: str, limit_mb: int, *, used_bytes: int = 0) -> None:
    """After the view is made (the copy driver's working copy is in the image): leave the task
    exactly ``limit_mb`` to write, less ``used_bytes`` its reopened layer already holds. A spare
    image has its ballast already."""
    point = mount_point(task_id)
    if not (point / RESERVE).exists() and mounts.is_mounted(point):
        _reserve(point, limit_mb, used_bytes)


def bind(source: Path, target: Path) -> None:
    """Show ``source`` (the working copy in the image) at ``target`` (the task's view)."""
    if mounts.is_mounted(target):
        return
    target.mkdir(parents=True, exist_ok=True)
    mounts.bind(source, target)


def reached(task_id: str, limit_mb: int) -> bool:
    """True when the task has used its disk: (almost) no space or no inode left in its image.
    Never mounts anything (a task whose image is not mounted is not writing)."""
    point = mount_point(task_id)
    if not mounts.is_mounted(point):
        return False
    st = os.statvfs(point)
    # ext4 refuses a write a little before the last block is used (per-CPU counters, metadata
    # for the write itself): within 1% of the limit, or 2 MB, counts as reached.
    margin = max(2 * MB, limit_mb * MB // 100)
    return st.f_bavail * st.f_frsize < margin or st.f_favail == 0


def unmount(task_id: str) -> None:
    """Unmount the task's image (it stays, for the task's next run)."""
    with _lock(task_id):
        while mounts.unmount(mount_point(task_id)):
            pass


def settle(task_id: str) -> None:
    """After the drivers sealed the task's roots, before the layer is marked sealed: copy the
    layer out of the image to ``layers/<task>/upper`` and delete the image. Idempotent; a crash
    anywhere leaves either the image (settled again) or the settled layer."""
    point = mounted(task_id)
    if point is None:
        return
    layer = paths.layer_dir(task_id)
    target = layer / "upper"
    source = point / "upper"  # the overlay driver's; the copy driver's layer is already out
    if source.is_dir():
        partial = layer / ".upper.settling"
        shutil.rmtree(partial, ignore_errors=True)
        # cp -a keeps what a layer is made of: whiteouts (0/0 devices), overlayfs's xattrs,
        # modes, times, hard links; --sparse keeps holes.
        subprocess.run(["cp", "-a", "--sparse=always", f"{source}/.", str(partial)], check=True, capture_output=True)
        _give_to_root(partial)
        if target.exists():
            shutil.rmtree(target)  # a settle cut short after the rename: this copy replaces it
        os.rename(partial, target)
    target.mkdir(exist_ok=True)
    with _lock(task_id):
        # The image is set aside at once (the layer is settled from here on); unmounting it and
        # deleting it take longer (ext4's shutdown, freeing the sparse file) and need not hold
        # up the task's end. ``sweep`` finishes what a stopped process left.
        aside = _aside_dir() / f"{task_id}-{os.getpid()}-{threading.get_ident()}.img"  # same filesystem
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(image_path(task_id), aside)
        except FileNotFoundError:
            pass
    threading.Thread(target=_drop, args=(task_id, point, aside), name="layers-disk-drop", daemon=True).start()


def _drop(task_id: str, point: Path, image: Path) -> None:
    with _lock(task_id):
        while mounts.unmount(point):
            pass
        try:
            point.rmdir()
        except OSError:
            pass
    image.unlink(missing_ok=True)


def _aside_dir() -> Path:
    return paths.data_dir() / "layers" / ".disk-aside"


def sweep() -> None:
    """At start-up: unmount the images of settled layers a stopped process left mounted, and
    delete the images set aside that no loop device holds any more."""
    for point in mounts.mounts_under(paths.data_dir() / "layers"):
        if point.name == "disk" and not (point.parent / "disk.img").exists():
            while mounts.unmount(point):
                pass
    if _aside_dir().is_dir():
        for image in _aside_dir().iterdir():
            if mounts.attached_loop(image) is None:
                image.unlink(missing_ok=True)


def _give_to_root(root: Path) -> None:
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

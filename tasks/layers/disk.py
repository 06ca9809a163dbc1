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
where every other layer is (``settle``): a finished layer is read, diffed, stacked, kept and undone
exactly as a layer written without an image. The overlay upper is copied out before the seal
rewrites it; the copy driver's seal moves each changed file out of the working copy. The copy costs
what the task changed. The image itself is then emptied and kept, still mounted, for a later task
(``_recycle``), or deleted when it cannot be.

Where the image cannot be made (not root, no loop devices, no ``mkfs.ext4``) ``unavailable()``
says why; ``limits.disk_mb`` is then refused and ``/api/health`` says the disk is not bounded.
"""
from __future__ import annotations

import _thread
import errno
import fcntl
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from tasks.layers import disk_image, mounts, paths, upper_copy

log = logging.getLogger(__name__)


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
    if shutil.which(disk_image.MKFS) is None:
        return f"{disk_image.MKFS} is not installed (Debian: e2fsprogs)"
    if not Path("/dev/loop-control").exists():
        return "this kernel offers no loop devices (/dev/loop-control)"
    base = paths.probe_dir(data, "disk-probe")
    image, point = base / "disk.img", base / "disk"
    try:
        point.mkdir(parents=True, exist_ok=True)
        disk_image.make_image(image, limit_mb=1, content_bytes=0, content_files=0)
        disk_image.mount(image, point)
        try:
            disk_image.reserve_beyond(point, 1)
            try:
                with open(point / "fill", "wb") as handle:
                    handle.write(b"x" * (2 * disk_image.MB))
                    handle.flush()
                    os.fsync(handle.fileno())
                return "a write past the limit of a loop-mounted ext4 image was not refused"
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        finally:
            mounts.unmount(point)
        return None
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"a loop-mounted ext4 image cannot be used on {data}: {disk_image.reason(exc)}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def warm() -> None:
    """At the box's start: spare images for the default limit, so the first tasks need not make
    their own. Not part of the probe: spares stay mounted until the box's stop drops them, and a
    process that only asked whether the disk can be bounded (a command, a test collecting) would
    leave them mounted behind it."""
    if settings.BOX_TASK_DISK_MB and unavailable() is None:
        make_spares(settings.BOX_TASK_DISK_MB)


def describe() -> str:
    reason = unavailable()
    if reason is not None:
        return f"not enforced: {reason}"
    return "a loop-mounted ext4 image per task, sized to its limit (bytes and files)"


# --- the image -----------------------------------------------------------------------------


def limited(task_id: str) -> bool:
    """The task's writes go to a disk image of its own (it exists until the layer is settled)."""
    return image_path(task_id).exists()


def create(task_id: str, limit_mb: int, *, content_bytes: int = 0, content_files: int = 0) -> Path:
    """Make and mount the task's image (at its first start; then only mounted). Its mount point.
    An image with no working copy in it (the overlay driver's) comes from the spares made ahead."""
    image, point = image_path(task_id), mount_point(task_id)
    with _lock(task_id):
        if not image.exists():
            if content_bytes or not _take_spare(limit_mb, image, point):
                disk_image.make_image(image, limit_mb=limit_mb, content_bytes=content_bytes, content_files=content_files)
            if not content_bytes:
                make_spares(limit_mb)
        if not disk_image.is_mount(point):
            disk_image.mount(image, point)
    return point


# --- spares: images made ahead, off the task's start ---------------------------------------
# A spare is ``<limit>-<name>.img``, kept mounted (its ballast taken) at ``<limit>-<name>.mnt``: a
# task takes the image by renaming it and its filesystem by a bind mount of that mount point, so
# a start pays no loop device and no ext4 mount, and the maker no unmount. (``MS_MOVE`` would
# spare the bind but is refused under shared mount propagation, where systemd hosts mount ``/``.)
# A task's image comes back the same way once its layer is settled (``_recycle``): emptied, its
# filesystem bound at a new spare's mount point, so tasks in a row make, mount, fill with ballast,
# unmount and delete no image at all.

SPARES = 2  # made ahead, per limit, per machine (``_spares_dir``)
SPARES_KEPT = 2 * SPARES  # an image given back is kept while fewer spares wait: one per task running


def _spares_dir() -> Path:
    """This machine's spares (a dot: never taken for a task's layer). They are mounted here, so
    they are in the machine's own directory: another machine sharing the data directory must
    never take an image this one has mounted, and mount it again (two kernels on one ext4). Where
    that directory is another filesystem than the layers, no image is handed over by a rename:
    each task makes its own, and none is used again."""
    return paths.local_dir() / "layers" / ".disk-spares"


def _take_spare(limit_mb: int, image: Path, point: Path) -> bool:
    for spare in sorted(_spares_dir().glob(f"{limit_mb}-*.img")):
        try:
            os.rename(spare, image)  # atomic: of two processes one gets it
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                return False  # the machine's directory is on another filesystem than the layers
            raise
        _adopt(spare.with_suffix(".mnt"), point)
        return True
    return False


def _adopt(source: Path, point: Path) -> None:
    """Show the spare's filesystem, mounted at ``source``, at ``point`` too, then drop ``source``.
    Checked after the bind: had the spare's mount gone first (``sweep``), the bind would show the
    empty directory under it, which is undone; the caller then mounts the image itself."""
    try:
        device = os.stat(source).st_dev
        if device == os.stat(source.parent).st_dev:
            return  # not mounted (made by an earlier process, or swept)
        point.mkdir(parents=True, exist_ok=True)
        mounts.bind(source, point)
        if os.stat(point).st_dev != device:
            mounts.unmount(point)
    except OSError:
        pass
    _in_background(_detach, source)


def _detach(source: Path) -> None:
    try:
        mounts.unmount(source)
        source.rmdir()
    except OSError:
        pass  # ``sweep`` drops what is left


def _in_background(work: Callable[..., None], *args: object) -> None:
    """Run ``work`` in a thread of its own without waiting for it to be scheduled, as
    ``threading.Thread.start`` does (a wait for the new thread to take the GIL, on the task's
    path). Like a daemon thread, it does not hold up the process's exit."""
    _thread.start_new_thread(work, args)


_making: set[tuple[str, int]] = set()
_making_lock = threading.Lock()


def _spare_count(limit_mb: int) -> int:
    return len(list(_spares_dir().glob(f"{limit_mb}-*.img")))


def make_spares(limit_mb: int) -> None:
    """Top up the spare images for ``limit_mb`` in the background (one maker per limit here)."""
    if _spare_count(limit_mb) >= SPARES:
        return  # the common case once images come back: no thread started only to count them
    key = (str(_spares_dir()), limit_mb)
    with _making_lock:
        if key in _making:
            return
        _making.add(key)
    directory = _spares_dir()

    def make() -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            while _spare_count(limit_mb) < SPARES:
                name = f"{limit_mb}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
                image, point = directory / f".{name}.making", directory / f"{name}.mnt"
                try:
                    disk_image.make_image(image, limit_mb=limit_mb, content_bytes=0, content_files=0)
                    point.mkdir()
                    disk_image.mount(image, point)
                    try:
                        (point / disk_image.LIMIT_FILE).write_text(f"{limit_mb}\n")  # before the ballast: it counts as the image's own
                        disk_image.reserve_beyond(point, limit_mb)  # the ballast too: allocating it is most of a start's cost
                        os.rename(image, directory / f"{name}.img")
                    except BaseException:
                        while mounts.unmount(point):
                            pass
                        raise
                finally:
                    image.unlink(missing_ok=True)
                    if not disk_image.is_mount(point):
                        point.rmdir()
        except (OSError, subprocess.SubprocessError):
            pass  # a task then makes its own image, as without spares
        finally:
            with _making_lock:
                _making.discard(key)

    _in_background(make)


def mounted(task_id: str) -> Path | None:
    """The mount point of the task's image, mounted again if a restart unmounted it; None when
    the task has no image (no limit, or its layer is settled)."""
    image, point = image_path(task_id), mount_point(task_id)
    if not image.exists():
        return None
    if disk_image.is_mount(point):
        return point
    with _lock(task_id):
        if not image.exists():
            return None
        if not disk_image.is_mount(point):
            if mounts.attached_loop(image) is None:
                # not mounted since a restart (or a crash): a filesystem without a journal is
                # checked first (-p: repairs what is safe, fails on anything else). One still on a
                # loop device is mounted somewhere (a spare's mount a crash left): it is live.
                subprocess.run(["e2fsck", "-p", str(image)], capture_output=True, timeout=300)
            disk_image.mount(image, point)
    return point


def reserve(task_id: str, limit_mb: int, *, used_bytes: int = 0) -> None:
    """After the view is made (the copy driver's working copy is in the image): leave the task
    exactly ``limit_mb`` to write, less ``used_bytes`` its reopened layer already holds. A spare
    image has its ballast already."""
    point = mount_point(task_id)
    if not (point / disk_image.RESERVE).exists() and disk_image.is_mount(point):
        disk_image.reserve_beyond(point, limit_mb, used_bytes)


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
    if not disk_image.is_mount(point):
        return False
    st = os.statvfs(point)
    # ext4 refuses a write a little before the last block is used (per-CPU counters, metadata
    # for the write itself): within 1% of the limit, or 2 disk_image.MB, counts as reached.
    margin = max(2 * disk_image.MB, limit_mb * disk_image.MB // 100)
    return st.f_bavail * st.f_frsize < margin or st.f_favail == 0


def unmount(task_id: str) -> None:
    """Unmount the task's image (it stays, for the task's next run)."""
    with _lock(task_id):
        while mounts.unmount(mount_point(task_id)):
            pass


def settle(task_id: str) -> None:
    """After the drivers sealed the task's roots, before the layer is marked sealed: copy the
    layer out of the image to ``layers/<task>/upper``, then set the image aside, to be emptied
    and kept as a spare or deleted in the background (``_hand_back``). Idempotent; a crash
    anywhere leaves either the image in the layer, its upper whole (settled again), or the
    settled layer. The image is never changed before it has left the layer."""
    # Mounted here before this call: an image this machine's kernel had mounted may be kept for
    # its next task; one mounted only now (after a restart, or by another machine's start that
    # seals the layer) is deleted, never handed to a task here while another kernel holds it.
    ours = disk_image.is_mount(mount_point(task_id))
    point = mounted(task_id)
    if point is None:
        return
    layer = paths.layer_dir(task_id)
    target = layer / "upper"
    source = point / "upper"  # the overlay driver's; the copy driver's layer is already out
    small = True
    if source.is_dir():
        partial = layer / ".upper.settling"
        shutil.rmtree(partial, ignore_errors=True)
        small = upper_copy.copy_small(source, partial)
        if not small:
            shutil.rmtree(partial, ignore_errors=True)
            # cp -a keeps what a layer is made of: whiteouts (0/0 devices), overlayfs's xattrs,
            # modes, times, hard links; --sparse keeps holes.
            subprocess.run(["cp", "-a", "--sparse=always", f"{source}/.", str(partial)], check=True, capture_output=True)
        upper_copy.give_to_root(partial)
        if target.exists():
            shutil.rmtree(target)  # a settle cut short after the rename: this copy replaces it
        os.rename(partial, target)
    target.mkdir(exist_ok=True)
    with _lock(task_id):
        # The image leaves the layer at once (the layer is settled from here on); emptying or
        # unmounting and deleting it take longer and need not hold up the task's end (nor the
        # layer's lock, which a start stacking the layer waits on). ``sweep`` deletes an image
        # a stopped process left aside.
        aside = _aside_dir() / f"{task_id}-{os.getpid()}-{threading.get_ident()}.img"  # same filesystem
        aside.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(image_path(task_id), aside)
        except FileNotFoundError:
            pass
    # Only an image whose upper was small is emptied in place: a large one's deletions, each a
    # discard, would take longer than deleting the image whole.
    _in_background(_hand_back, task_id, point, aside, ours and small)


def _hand_back(task_id: str, point: Path, aside: Path, keep: bool) -> None:
    """In the background, the image set aside: a spare again (``_recycle``) when it may be, else
    unmounted and deleted (``_drop``)."""
    try:
        if keep and _recycle(task_id, point, aside):
            return
    except Exception:  # noqa: BLE001 - an image not kept is deleted below; nothing of a task is lost either way
        log.warning("the disk image of task %s could not be kept as a spare; it is deleted", task_id, exc_info=True)
    _drop(task_id, point, aside)


def _recycle(task_id: str, point: Path, image: Path) -> bool:
    """The settled layer's image ``image`` (set aside), still mounted at ``point``: emptied and
    made a spare again, still mounted, its ballast kept. False, the image as it was, when it
    cannot be used again: not made as a spare (no ``disk_image.LIMIT_FILE``), enough spares already,
    something in ``lost+found`` (a check's finds), a loop device that cannot discard, the spares
    on another filesystem, or less room than its limit once emptied.

    Nothing of the task stays: every entry of the image's root but the ballast, the limit and
    ext4's empty ``lost+found`` is removed (the overlay's upper and workdir; the task saw nothing
    else of the image), and the image file is synced once its freed blocks are discarded (holes
    in the file, kept across a host's crash), so a later task reads nothing of this one's: ext4
    never shows a new file another file's old blocks, and the old blocks are gone from the disk.
    A crash meanwhile leaves the image aside, which ``sweep`` deletes, and at worst a spare's
    mount point with no image, which it drops."""
    with _lock(task_id):
        if not disk_image.is_mount(point):
            return False
        try:
            limit_mb = int((point / disk_image.LIMIT_FILE).read_text())
        except (OSError, ValueError):
            return False
        spares = _spares_dir()
        spares.mkdir(parents=True, exist_ok=True)
        if (_spare_count(limit_mb) >= SPARES_KEPT or os.listdir(point / "lost+found") or not _discards(point)
                or os.stat(spares).st_dev != os.stat(image).st_dev):
            return False
        for entry in os.scandir(point):
            if entry.name in disk_image.KEPT_ENTRIES:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        st = os.statvfs(point)
        if st.f_bavail * st.f_frsize < limit_mb * disk_image.MB - max(2 * disk_image.MB, limit_mb * disk_image.MB // 100):
            return False  # the ballast grew, or ext4 kept space: a fresh image is exact again
        fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)  # the holes the discards punched, on the disk before another task writes here
        finally:
            os.close(fd)
        name = f"{limit_mb}-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        mount = spares / f"{name}.mnt"
        mount.mkdir()
        try:
            mounts.bind(point, mount)
        except OSError:
            mount.rmdir()
            return False
        while mounts.unmount(point):
            pass
        os.rename(image, spares / f"{name}.img")
        try:
            point.rmdir()
        except OSError:
            pass
    return True


def _discards(point: Path) -> bool:
    """The filesystem mounted at ``point`` is on a device that discards (a loop device over a
    file that can have holes punched in it): a block a task frees leaves the disk."""
    device = os.stat(point).st_dev
    try:
        return int(Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/queue/discard_max_bytes").read_text()) > 0
    except (OSError, ValueError):
        return False


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
    """At start-up and stop: unmount the images of settled layers a stopped process left mounted,
    delete the images set aside that no loop device holds any more, and drop the spares (one a
    crash left mounted may not have been written out cleanly; the next task's start makes more)."""
    for point in mounts.mounts_under(paths.data_dir() / "layers"):
        if point.name == "disk" and not (point.parent / "disk.img").exists():
            while mounts.unmount(point):
                pass
    if _aside_dir().is_dir():
        for image in _aside_dir().iterdir():
            if mounts.attached_loop(image) is None:
                image.unlink(missing_ok=True)
    drop_spares()


def drop_spares() -> None:
    """Unmount and delete the spare images (at stop: the box leaves no mount behind), once this
    process's makers are done."""
    deadline = time.monotonic() + 60
    while _making and time.monotonic() < deadline:
        time.sleep(0.01)
    spares = _spares_dir()
    if spares.is_dir():
        mounts.unmount_all_under(spares)
        for entry in spares.iterdir():
            try:
                entry.rmdir() if entry.suffix == ".mnt" else entry.unlink()
            except OSError:
                pass



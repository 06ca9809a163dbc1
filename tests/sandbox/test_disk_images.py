"""The disk limit's images themselves (tasks.layers.disk): spares handed over already mounted, the
ballast never outside an image, the upper settled out without a process, a loop device found
attached but gone before the mount."""
from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.layers import disk, disk_image, mounts, paths, upper_copy
from tests.conftest import wait_for
from tests.sandbox.conftest import needs_sandbox

pytestmark = needs_sandbox

LIMIT = 16


@pytest.fixture
def data(settings: Any) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="bd-", dir="/tmp"))
    settings.BOX_DATA_DIR = where
    (where / "layers").mkdir()
    yield where
    wait_for(lambda: not disk._making, timeout=30, what="the spare maker done")
    leftover = mounts.mounts_under(where)
    mounts.unmount_all_under(where)
    shutil.rmtree(where, ignore_errors=True)
    assert not [p for p in leftover if ".disk-spares" not in str(p) and p.name != "disk"], leftover


def _spares() -> list[Path]:
    wait_for(lambda: not disk._making and len(list(disk._spares_dir().glob(f"{LIMIT}-*.img"))) == disk.SPARES,
             timeout=30, what="the spares made")
    return sorted(disk._spares_dir().glob(f"{LIMIT}-*.img"))


def _free_mb(point: Path) -> float:
    st = os.statvfs(point)
    return st.f_bavail * st.f_frsize / disk_image.MB


def test_a_task_takes_a_spare_already_mounted_with_its_ballast(data: Path) -> None:
    disk.make_spares(LIMIT)
    spare = _spares()[0]
    spare_mount = spare.with_suffix(".mnt")
    assert disk_image.is_mount(spare_mount)  # kept mounted, ballast taken
    device = os.stat(spare_mount).st_dev

    (data / "layers" / "t1").mkdir()
    point = disk.create("t1", LIMIT)

    assert os.stat(point).st_dev == device  # the spare's own filesystem: no second mount of the image
    wait_for(lambda: not spare_mount.exists(), timeout=10, what="the spare's own mount point dropped")
    assert (point / disk_image.RESERVE).exists()
    assert LIMIT - 2 <= _free_mb(point) <= LIMIT
    with pytest.raises(OSError) as raised:
        (point / "fill").write_bytes(b"x" * (LIMIT + 2) * disk_image.MB)
    assert raised.value.errno == errno.ENOSPC


def test_a_spare_whose_mount_went_is_mounted_by_the_task_itself(data: Path) -> None:
    disk.make_spares(LIMIT)
    for spare in _spares():
        mounts.unmount(spare.with_suffix(".mnt"))  # as a sweep at stop leaves them

    (data / "layers" / "t2").mkdir()
    point = disk.create("t2", LIMIT)

    assert disk_image.is_mount(point) and (point / disk_image.RESERVE).exists()
    assert LIMIT - 2 <= _free_mb(point) <= LIMIT
    assert mounts.attached_loop(disk.image_path("t2")) is not None


def test_the_ballast_is_never_made_where_no_image_is_mounted(data: Path) -> None:
    bare = data / "layers" / "bare"
    bare.mkdir()
    with pytest.raises(disk_image.DiskError) as raised:
        disk_image.reserve_beyond(bare, 10**9)
    assert raised.value.errno == errno.ENODEV
    assert not list(bare.iterdir())


def test_sweep_drops_the_spares_and_their_mounts(data: Path) -> None:
    disk.make_spares(LIMIT)
    _spares()
    disk.sweep()
    assert not mounts.mounts_under(disk._spares_dir())
    assert not list(disk._spares_dir().iterdir())


def _upper(root: Path) -> None:
    root.mkdir()
    (root / "dir").mkdir(mode=0o750)
    (root / "dir" / "file.txt").write_text("kept\n")
    os.chmod(root / "dir" / "file.txt", 0o4755)
    os.chown(root / "dir" / "file.txt", 200_001, 200_002)
    os.setxattr(root / "dir", "trusted.overlay.opaque", b"y")
    os.setxattr(root / "dir" / "file.txt", "user.note", b"v")
    os.mknod(root / "gone", stat.S_IFCHR | 0o644, 0)  # a whiteout
    os.symlink("dir/file.txt", root / "link")
    os.utime(root / "dir" / "file.txt", ns=(1_000_000_123, 2_000_000_456))
    os.utime(root / "dir", ns=(3_000_000_000, 4_000_000_000))


def _listing(root: Path) -> list[tuple[Any, ...]]:
    out = []
    for current, dirs, files in os.walk(root):
        for name in sorted((*dirs, *files)):
            path = os.path.join(current, name)
            st = os.lstat(path)
            xattrs = {} if stat.S_ISLNK(st.st_mode) else {x: os.getxattr(path, x) for x in os.listxattr(path)}
            content = Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else None
            out.append((os.path.relpath(path, root), st.st_mode, st.st_uid, st.st_gid, st.st_rdev, st.st_mtime_ns,
                        xattrs, content, os.readlink(path) if stat.S_ISLNK(st.st_mode) else None))
    return out


def test_a_small_upper_is_copied_as_cp_a_would_without_a_process(tmp_path: Path) -> None:
    _upper(tmp_path / "upper")
    subprocess.run(["cp", "-a", f"{tmp_path / 'upper'}/.", str(tmp_path / "by-cp")], check=True)

    assert upper_copy.copy_small(tmp_path / "upper", tmp_path / "by-python")

    assert _listing(tmp_path / "by-python") == _listing(tmp_path / "by-cp")
    assert os.stat(tmp_path / "by-python").st_mode == os.stat(tmp_path / "by-cp").st_mode


@pytest.mark.parametrize("odd", ["hard link", "sparse", "fifo"])
def test_an_upper_with_hard_links_holes_or_odd_files_is_left_to_cp(tmp_path: Path, odd: str) -> None:
    _upper(tmp_path / "upper")
    if odd == "hard link":
        os.link(tmp_path / "upper" / "dir" / "file.txt", tmp_path / "upper" / "again")
    elif odd == "sparse":
        with open(tmp_path / "upper" / "holes", "wb") as handle:
            handle.truncate(disk_image.MB // 2)
    else:
        os.mkfifo(tmp_path / "upper" / "pipe")
    assert not upper_copy.copy_small(tmp_path / "upper", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_a_loop_device_found_attached_but_cleared_before_the_mount_is_not_mounted(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose last user went between finding it and mounting it is cleared (autoclear):
    mounted then, it gave EIO under load. Seen stale once held, a device of its own is taken."""
    image, point = data / "layers" / "img", data / "layers" / "point"
    point.mkdir()
    disk_image.make_image(image, limit_mb=LIMIT, content_bytes=0, content_files=0)
    control = os.open("/dev/loop-control", os.O_RDWR)
    try:
        stale = f"/dev/loop{mounts._lib().ioctl(control, mounts._LOOP_CTL_GET_FREE)}"  # attached to nothing
    finally:
        os.close(control)
    answers = iter([stale])
    real = mounts.attached_loop
    monkeypatch.setattr(mounts, "attached_loop", lambda wanted: next(answers, None) or real(wanted))

    mounts.mount_image(image, point)

    assert disk_image.is_mount(point)
    mounts.unmount(point)


def test_asking_whether_the_disk_can_be_bounded_leaves_nothing_mounted(data: Path, settings: Any) -> None:
    """A process that only asks (a management command, a test module collected) makes no spare
    images: they stay mounted until a box's stop drops them, and such a process has no stop."""
    settings.BOX_TASK_DISK_MB = LIMIT
    assert disk.unavailable() is None
    assert not disk._making
    assert not mounts.mounts_under(data)
    disk.warm()  # the box's start does make them
    assert len(_spares()) == disk.SPARES


def _settled(task_id: str) -> None:
    """``disk.settle``, then the image's hand-back in the background done (kept or deleted)."""
    disk.settle(task_id)
    wait_for(lambda: not list((paths.data_dir() / "layers" / ".disk-aside").glob(f"{task_id}-*")), timeout=20,
             what="the image kept as a spare or deleted")


def _task_image(data: Path, task_id: str) -> Path:
    """A task's image taken from the spares, with what a run leaves in it: an upper holding a
    file of the task's user, and the overlay's workdir."""
    (data / "layers" / task_id).mkdir()
    point = disk.create(task_id, LIMIT)
    (point / "upper").mkdir()
    (point / "upper" / "secret.txt").write_text("the first task's\n")
    os.chown(point / "upper" / "secret.txt", 200_001, 200_001)
    (point / "ovl-work" / "work").mkdir(parents=True)
    wait_for(lambda: not disk._making, timeout=30, what="the spare maker done")
    return point


def _root_entries(point: Path) -> set[str]:
    return set(os.listdir(point))


def test_a_settled_image_is_emptied_and_the_next_task_takes_it_with_nothing_of_the_first(data: Path) -> None:
    disk.make_spares(LIMIT)
    _spares()
    point = _task_image(data, "t1")
    device = os.stat(point).st_dev
    disk.drop_spares()  # the others: the one given back is then the only spare

    _settled("t1")

    assert (data / "layers" / "t1" / "upper" / "secret.txt").read_text() == "the first task's\n"  # the layer is out
    assert not disk.limited("t1") and not disk_image.is_mount(point)
    (spare,) = disk._spares_dir().glob(f"{LIMIT}-*.img")
    kept = spare.with_suffix(".mnt")
    assert os.stat(kept).st_dev == device  # the same filesystem, still mounted: no unmount, no new image
    assert _root_entries(kept) == disk_image.KEPT_ENTRIES
    assert LIMIT - 2 <= _free_mb(kept) <= LIMIT

    (data / "layers" / "t2").mkdir()
    again = disk.create("t2", LIMIT)
    assert os.stat(again).st_dev == device
    assert _root_entries(again) == disk_image.KEPT_ENTRIES  # nothing of the first task's
    assert LIMIT - 2 <= _free_mb(again) <= LIMIT
    with pytest.raises(OSError) as raised:
        (again / "fill").write_bytes(b"x" * (LIMIT + 2) * disk_image.MB)
    assert raised.value.errno == errno.ENOSPC


def test_an_image_made_for_a_working_copy_is_deleted_not_kept(data: Path) -> None:
    (data / "layers" / "t3").mkdir()
    point = disk.create("t3", LIMIT, content_bytes=disk_image.MB, content_files=10)  # the copy driver's: no spare
    assert not (point / disk_image.LIMIT_FILE).exists()

    _settled("t3")

    assert not list(disk._spares_dir().glob(f"{LIMIT}-*.img"))  # none made, none given back


def test_an_image_is_deleted_when_enough_spares_wait(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk.make_spares(LIMIT)
    _spares()
    _task_image(data, "t4")
    monkeypatch.setattr(disk, "SPARES_KEPT", disk.SPARES)

    _settled("t4")

    assert len(list(disk._spares_dir().glob(f"{LIMIT}-*.img"))) == disk.SPARES
    assert not disk.limited("t4")


def test_an_image_whose_lost_and_found_holds_something_is_deleted(data: Path) -> None:
    disk.make_spares(LIMIT)
    _spares()
    point = _task_image(data, "t5")
    disk.drop_spares()
    (point / "lost+found" / "#12").write_text("what a check found\n")  # as e2fsck leaves it

    _settled("t5")

    assert not list(disk._spares_dir().glob(f"{LIMIT}-*.img"))


def test_a_machine_takes_only_its_own_spares(data: Path, settings: Any) -> None:
    """Spares are mounted by the machine that made them: one sharing the data directory must
    never take such an image (it would mount the same ext4 a second time, from another kernel)."""
    settings.BOX_LOCAL_DIR = data / "machine-a"
    disk.make_spares(LIMIT)
    made = _spares()
    assert all(data / "machine-a" in spare.parents for spare in made)

    settings.BOX_LOCAL_DIR = data / "machine-b"
    (data / "layers" / "t6").mkdir()
    point = disk.create("t6", LIMIT)
    wait_for(lambda: not disk._making, timeout=30, what="machine b's spare maker done")

    assert all(spare.exists() for spare in made)  # machine a's, untouched
    device = os.stat(point).st_dev
    assert all(device != os.stat(spare.with_suffix(".mnt")).st_dev for spare in made)
    _settled("t6")  # made on machine b's path: no spare waited there, so not kept
    own = {os.stat(spare.with_suffix(".mnt")).st_dev: spare for spare in disk._spares_dir().glob(f"{LIMIT}-*.img")}
    assert own and all(data / "machine-b" in spare.parents for spare in own.values()) and device not in own
    (data / "layers" / "t9").mkdir()
    assert os.stat(disk.create("t9", LIMIT)).st_dev in own  # machine b's next task takes machine b's spare
    assert sorted((data / "machine-a" / "layers" / ".disk-spares").glob(f"{LIMIT}-*.img")) == sorted(made)
    wait_for(lambda: not disk._making, timeout=30, what="machine b's spare maker done")
    disk.drop_spares()
    settings.BOX_LOCAL_DIR = data / "machine-a"
    disk.drop_spares()


def test_a_machine_directory_on_another_filesystem_makes_each_image_and_keeps_none(data: Path, settings: Any) -> None:
    local = Path(tempfile.mkdtemp(prefix="bd-local-", dir="/dev/shm"))  # tmpfs: not the layers' filesystem
    try:
        settings.BOX_LOCAL_DIR = local
        assert os.stat(local).st_dev != os.stat(data).st_dev
        disk.make_spares(LIMIT)
        _spares()
        (data / "layers" / "t7").mkdir()
        point = disk.create("t7", LIMIT)  # the spare cannot be renamed into the layer: an image of its own
        assert disk_image.is_mount(point) and not (point / disk_image.LIMIT_FILE).exists()
        wait_for(lambda: not disk._making, timeout=30, what="the spare maker done")
        before = sorted(disk._spares_dir().glob(f"{LIMIT}-*.img"))

        _settled("t7")

        assert sorted(disk._spares_dir().glob(f"{LIMIT}-*.img")) == before
    finally:
        disk.drop_spares()
        mounts.unmount_all_under(local)
        shutil.rmtree(local, ignore_errors=True)


def test_an_image_emptied_in_part_when_its_process_died_never_takes_the_layer_with_it(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image leaves the layer before anything in it is deleted: a process killed while it
    emptied the image (here, half of the upper's copy inside it gone, then the "kill") leaves the
    layer whole, and settling the layer again, as reconcile does, keeps every file."""
    disk.make_spares(LIMIT)
    _spares()
    point = _task_image(data, "t8")
    for i in range(40):
        (point / "upper" / f"f{i}.txt").write_text(f"{i}\n")
    real_rmtree = shutil.rmtree

    class Killed(BaseException):
        pass

    def half_then_killed(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name == "upper":
            for victim in sorted(Path(path).iterdir())[::2]:
                victim.unlink()
            raise Killed
        real_rmtree(path, *args, **kwargs)

    kept: list[tuple[Any, ...]] = []
    monkeypatch.setattr(disk, "_in_background", lambda work, *args: kept.append((work, *args)))
    disk.settle("t8")
    (work, *args), = kept
    monkeypatch.setattr(shutil, "rmtree", half_then_killed)
    with pytest.raises(Killed):
        disk._recycle(*args[:3])
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)

    disk.settle("t8")  # again, as after a restart
    layer = data / "layers" / "t8" / "upper"
    assert sorted(p.name for p in layer.iterdir()) == sorted(["secret.txt", *(f"f{i}.txt" for i in range(40))])
    # The image a stopped process left aside goes at a sweep once no loop device holds it: the
    # kernel lets go of the loop device of a lazily unmounted image in the background.
    def swept() -> bool:
        disk.sweep()
        return not list((data / "layers" / ".disk-aside").glob("t8-*"))

    wait_for(swept, timeout=10, what="the image left aside deleted")

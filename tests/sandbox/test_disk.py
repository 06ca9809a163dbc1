"""The disk limit: what a task writes to its layer is bounded by the kernel (its own filesystem,
as large as the limit). A task past it fails with the limit named, on both layer drivers; its
layer stays readable and diffable, the box and the next task are untouched, and a task within
its limit is kept and undone as ever."""
from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tasks.layers import base, disk, disk_image, mounts, paths
from tests.conftest import wait_for
from tests.factories import flow
from tests.layers.conftest import diff_of, read, undo
from tests.sandbox.conftest import needs_sandbox

pytestmark = needs_sandbox

SMALL_FILES = textwrap.dedent("""
    import os
    os.mkdir("many")
    n = 0
    try:
        while n < 1_000_000:
            open("many/%d" % n, "w").close()
            n += 1
    except OSError as exc:
        print("stopped=%d %s" % (n, exc.strerror))
        raise SystemExit(1)
    print("survived=%d" % n)
""")


@pytest.fixture(params=["overlay", "copy"])
def limited(request: Any, sandboxed: Any, settings: Any) -> Any:
    settings.BOX_LAYER_DRIVER = request.param
    if disk.unavailable():
        raise AssertionError(f"this machine runs the sandbox tests as root, so the disk limit must hold: {disk.unavailable()}")
    return sandboxed


def _nothing_left(task_id: str) -> None:
    # the task's release (and so its seal) runs in the background after it ends
    wait_for(lambda: not disk.image_path(task_id).exists(), timeout=30, what="the layer settled out of its image")
    # unmounted in the background once the layer is out of it
    wait_for(lambda: not mounts.mounts_under(paths.layer_dir(task_id)), timeout=20, what="the image unmounted")
    wait_for(lambda: not list((paths.data_dir() / "layers" / ".disk-aside").glob(f"{task_id}-*")), timeout=20,
             what="the image deleted")


def test_a_task_writing_past_its_disk_limit_fails_clearly_and_the_next_task_is_fine(limited: Any) -> None:
    task = limited.create(title="filler", limits={"disk_mb": 32}, flow=flow(
        {"run": "echo kept > note.txt"},
        {"run": "dd if=/dev/zero of=big bs=1M count=200 && echo survived"},
    ))
    view = limited.wait_state(task["id"], "done", "failed", timeout=60)
    assert view["state"] == "failed" and view["error"] == "disk limit of 32 MB reached", view
    assert view["limits"]["disk_mb"] == 32
    _nothing_left(task["id"])
    # The layer stays: what the task wrote up to its limit is in its diff, and on disk.
    body = diff_of(limited, task["id"])
    assert {"note.txt", "big"} <= set(body["added"]), body["added"]
    big = paths.layer_dir(task["id"]) / "upper" / "big"
    assert 24 * 2**20 <= big.stat().st_size <= 32 * 2**20, big.stat().st_size
    assert big.stat().st_uid == 0  # handed back from the task's user
    # The next task (the default limit, from settings) runs, is kept, and is undone as ever.
    after = limited.create(title="next", flow=flow({"run": "dd if=/dev/zero of=ok bs=1M count=8 && echo fine > fine.txt"}))
    done = limited.wait_state(after["id"], "done", "failed", timeout=60)
    assert done["state"] == "done", done
    assert done["limits"]["disk_mb"] == settings.BOX_TASK_DISK_MB
    _nothing_left(after["id"])
    assert read(limited, "fine.txt") == "fine\n"
    undo(limited, after["id"])
    assert read(limited, "fine.txt") is None and read(limited, "note.txt") is None


def test_a_task_making_many_small_files_stops_at_its_limit(limited: Any) -> None:
    task = limited.create(title="inodes", limits={"disk_mb": 16}, worker="command", prompt="p",
                          command=["/usr/bin/python3", "-c", SMALL_FILES])
    view = limited.wait_state(task["id"], "done", "failed", timeout=120)
    assert view["state"] == "failed" and view["error"] == "disk limit of 16 MB reached", view
    _nothing_left(task["id"])
    many = paths.layer_dir(task["id"]) / "upper" / "many"
    count = len(os.listdir(many))
    assert 500 <= count <= 4096, count  # about the limit's share of files, and no more


def test_changing_a_file_larger_than_the_limit_and_undoing_a_task_within_it(limited: Any) -> None:
    (Path(limited.home) / "large.bin").write_bytes(b"\0" * (24 * 2**20))  # changing it copies it whole
    (Path(limited.home) / "data.txt").write_text("old\n")
    task = limited.create(title="edit large", limits={"disk_mb": 16}, flow=flow(
        {"run": "printf x | dd of=large.bin bs=1 seek=10 conv=notrunc"},
    ))
    view = limited.wait_state(task["id"], "done", "failed", timeout=60)
    if settings.BOX_LAYER_DRIVER == "overlay":
        # The copy-up is refused whole: nothing stays used, so the step's own error says it.
        assert view["state"] == "failed" and "No space left on device" in view["error"], view
    else:
        assert view["state"] == "done", view  # the working copy already holds the file: one byte written
    _nothing_left(task["id"])
    small = limited.create(title="edit small", limits={"disk_mb": 16}, flow=flow({"run": "echo new > data.txt"}))
    assert limited.wait_state(small["id"], "done", "failed", timeout=60)["state"] == "done"
    _nothing_left(small["id"])
    assert diff_of(limited, small["id"])["modified"] == ["data.txt"]
    assert read(limited, "data.txt") == "new\n"
    undo(limited, small["id"])
    assert read(limited, "data.txt") == "old\n"


def test_health_says_the_disk_limit_holds(limited: Any) -> None:
    held = limited.api.get("/api/health").json()["isolation"]["limits"]["disk"]
    assert held["enforced"] is True and held["default_mb"] == settings.BOX_TASK_DISK_MB, held
    assert held["how"].startswith("enforced with a loop-mounted ext4 image"), held


def test_a_probe_killed_with_its_image_mounted_leaves_nothing_once_the_box_probes_again(settings: Any) -> None:
    """A box process killed between its probe's mount and unmount left the mount behind, and
    nothing took it down: CI's next clone could not delete the data directory. The next probe
    (any box process, at its first need) removes the leftovers of processes that are gone."""
    data = Path(settings.BOX_DATA_DIR)
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    left = data / "layers" / f".disk-probe-{gone}-1"
    left.mkdir(parents=True)
    disk_image.make_image(left / "disk.img", limit_mb=1, content_bytes=0, content_files=0)
    disk_image.mount(left / "disk.img", left / "disk")  # as the probe had it when it was killed
    overlay_left = data / "layers" / f".probe-{gone}-1"
    for part in ("lower", "upper", "work", "view"):
        (overlay_left / part).mkdir(parents=True)
    mounts.mount_overlay(overlay_left / "view", [overlay_left / "lower"], overlay_left / "upper", overlay_left / "work")
    mine = data / "layers" / f".disk-probe-{os.getpid()}-2"
    mine.mkdir()  # a probe of a process still running is left alone
    try:
        assert mounts.mounts_under(left) and mounts.mounts_under(overlay_left)
        assert disk._run_probe(data) is None and base._run_probe(data) is None
        assert not mounts.mounts_under(left) and not left.exists()
        assert not mounts.mounts_under(overlay_left) and not overlay_left.exists()
        assert mine.is_dir()
    finally:
        mounts.unmount_all_under(left, overlay_left)
        for path in (left, overlay_left, mine):
            shutil.rmtree(path, ignore_errors=True)

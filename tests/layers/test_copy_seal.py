"""A copy-driver seal cut short by a kill is finished by the next one (the worker's start-up
recovery here): the layer ends with every change and every deletion of the task, whichever
point the kill hit (``tests.layers.seal_crash``), and no journal is left. The working copy is on
the data filesystem (moves are renames), or in the task's disk image (moves are copies)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction

from boxsite.core.errors import Conflict
from tasks import sandbox
from tasks.layers import disk, paths
from tasks.layers.roots import roots_for
from tasks.layers.task_view import REOPENED, _reopen, on_final_move, on_retry, open_view
from tasks.models import Layer, Task
from tasks.run import lifecycle
from tasks.states import State
from tests.cluster import MANAGE
from tests.conftest import Box, database_env, queue_through_the_cluster
from tests.factories import flow
from tests.layers.conftest import diff_of, read
from tests.layers.seal_crash import POINTS

pytestmark = pytest.mark.parametrize("driver", ["copy"], indirect=True)


def _ended_task_with_changes(lbox: Box, *, disk_mb: int | None = None, state: str = State.DONE) -> str:
    """A task ended in ``state`` whose view holds its changes and deletions, its layer not yet
    sealed: what a worker leaves when it is killed just after the task's final move."""
    (lbox.home / "keep.txt").write_text("keep\n")
    (lbox.home / "edit.txt").write_text("old\n")
    (lbox.home / "gone.txt").write_text("bye\n")
    (lbox.home / "olddir").mkdir()
    (lbox.home / "olddir" / "a.txt").write_text("a\n")
    (lbox.home / "olddir" / "b.txt").write_text("b\n")
    (lbox.home / "sub").mkdir()
    (lbox.home / "sub" / "edit2.txt").write_text("old2\n")
    limits = {"disk_mb": disk_mb} if disk_mb else {}
    created = lbox.create(title="edits", flow=flow({"run": "true"}), limits=limits)  # queued: no worker here runs it
    task = Task.objects.get(pk=created["id"])
    view = open_view(task)
    # what the task wrote: two files changed, three added (one in new directories, one a link), a
    # file and a directory deleted: five moves into the layer and three deletions
    (view / "edit.txt").write_text("new\n")
    (view / "sub" / "edit2.txt").write_text("new2\n")
    (view / "new" / "deep").mkdir(parents=True)
    (view / "new" / "deep" / "file.txt").write_text("made\n")
    (view / "top.txt").write_text("top\n")
    (view / "link").symlink_to("top.txt")
    (view / "gone.txt").unlink()
    for name in ("a.txt", "b.txt"):
        (view / "olddir" / name).unlink()
    (view / "olddir").rmdir()
    _move(task, state)
    return task.pk


def _view_of(task_id: str) -> Path:
    """The ended task's working copy (the copy driver's view)."""
    task = Task.objects.get(pk=task_id)
    [root] = roots_for(task, Layer.objects.get(task_id=task_id), for_mount=False)
    return root.view


def _move(task: Task, state: str) -> None:
    """The task's move as a service makes it, with the layer's part of it."""
    with transaction.atomic():
        Task.objects.filter(pk=task.pk).update(state=state)
        if state == State.QUEUED:
            on_retry(task)
        else:
            on_final_move(task, state)


def _release_killed_at(task_id: str, point: str) -> None:
    env = {**database_env(), "BOX_LAYER_DRIVER": "copy"}
    code = f"from tests.layers.seal_crash import kill_release_at; kill_release_at({task_id!r}, {point!r})"
    done = subprocess.run([sys.executable, MANAGE, "shell", "-c", code], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, (point, done.returncode, done.stderr.decode()[-2000:])


def _assert_the_layer_holds_the_whole_task(lbox: Box, task_id: str) -> None:
    assert read(lbox, "edit.txt") == "new\n"
    assert read(lbox, "sub/edit2.txt") == "new2\n"
    assert read(lbox, "new/deep/file.txt") == "made\n"
    assert read(lbox, "top.txt") == "top\n"
    assert read(lbox, "keep.txt") == "keep\n"
    assert lbox.api.get("/api/workspaces/home/files", {"path": "link"}).json()["target"] == "top.txt"
    assert read(lbox, "gone.txt") is None
    assert read(lbox, "olddir/a.txt") is None
    names = [entry["name"] for entry in lbox.api.get("/api/workspaces/home/files").json()["entries"]]
    assert sorted(names) == ["edit.txt", "keep.txt", "link", "new", "sub", "top.txt"]
    diff: dict[str, Any] = diff_of(lbox, task_id)
    assert diff["added"] == ["link", "new/deep/file.txt", "top.txt"]
    assert diff["modified"] == ["edit.txt", "sub/edit2.txt"]
    assert diff["deleted"] == ["gone.txt", "olddir/a.txt", "olddir/b.txt"]
    meta = json.loads((paths.layer_dir(task_id) / "meta.json").read_text())
    assert meta["sealed"] and "sealing" not in meta, meta  # the journal ended with the sealed save


@pytest.fixture(autouse=True)
def _no_worker(settings: Any) -> None:
    queue_through_the_cluster(settings)


@pytest.mark.parametrize(("where", "point"), [
    *(("data", point) for point in POINTS if point != "inside a move"),  # a rename has no inside
    *(("disk image", point) for point in POINTS),
])
def test_a_seal_killed_at_any_point_is_finished_by_the_start_up_recovery(lbox, where, point):
    if where == "disk image" and (not sandbox.available() or disk.unavailable()):
        pytest.skip(f"no disk images here: {disk.unavailable() or 'no sandbox'}")
    task_id = _ended_task_with_changes(lbox, disk_mb=16 if where == "disk image" else None)
    _release_killed_at(task_id, point)
    lifecycle.release_ended()  # what a worker's start runs
    _assert_the_layer_holds_the_whole_task(lbox, task_id)


def test_a_resumed_seal_killed_again_is_finished_by_the_next(lbox):
    task_id = _ended_task_with_changes(lbox)
    _release_killed_at(task_id, "after two moves")
    _release_killed_at(task_id, "after the working copy is gone")  # the resumed seal, killed in its turn
    lifecycle.release_ended()
    _assert_the_layer_holds_the_whole_task(lbox, task_id)


def test_a_retry_does_not_reopen_a_layer_whose_seal_is_unfinished(lbox):
    task_id = _ended_task_with_changes(lbox, state=State.FAILED)
    _release_killed_at(task_id, "after two moves")
    task = Task.objects.get(pk=task_id)
    _move(task, State.QUEUED)  # retried, the retry's release having failed to finish the seal
    with pytest.raises(Conflict):
        open_view(task)  # a fresh view would be taken for the working copy the journal names
    _move(task, State.FAILED)  # the run fails with that; its release finishes the seal
    lifecycle.release_ended()
    _move(task, State.QUEUED)
    view = open_view(Task.objects.get(pk=task_id))
    assert (view / "edit.txt").read_text() == "new\n" and (view / "top.txt").read_text() == "top\n"
    assert (view / "new" / "deep" / "file.txt").read_text() == "made\n" and os.readlink(view / "link") == "top.txt"
    assert not (view / "gone.txt").exists() and not (view / "olddir").exists()


def test_a_file_that_vanished_before_the_resumed_seal_carried_it_does_not_block_the_seal(lbox):
    """A journaled file gone from the working copy (a process that outlived the task deleted
    it, or a power cut lost it) is carried as nothing; the rest of the task is sealed, and the
    workspace's next start is not refused for good. A directory's mode is kept on the resume
    even where the cut seal made it and died before copying its mode."""
    task_id = _ended_task_with_changes(lbox)
    view = _view_of(task_id)
    os.chmod(view / "new" / "deep", 0o700)
    _release_killed_at(task_id, "before the first move")  # journaled, directories made, nothing moved
    os.chmod(paths.layer_dir(task_id) / "upper" / "new" / "deep", 0o755)  # as if cut before its copystat
    (view / "top.txt").unlink()
    lifecycle.release_ended()
    meta = json.loads((paths.layer_dir(task_id) / "meta.json").read_text())
    assert meta["sealed"] and "sealing" not in meta, meta
    assert read(lbox, "top.txt") is None
    assert read(lbox, "edit.txt") == "new\n" and read(lbox, "new/deep/file.txt") == "made\n"
    assert read(lbox, "gone.txt") is None and read(lbox, "olddir/a.txt") is None
    assert stat.S_IMODE(os.stat(paths.layer_dir(task_id) / "upper" / "new" / "deep").st_mode) == 0o700
    later = lbox.create(title="later", flow=flow({"run": "true"}))
    assert open_view(Task.objects.get(pk=later["id"])).is_dir()  # the workspace still starts tasks


def test_a_restore_of_a_set_aside_layer_cut_short_loses_nothing(lbox):
    """A retry set the sealed layer aside and its run died before laying it back; the release
    that restores it was cut after moving the kept files back. The next release finishes the
    restore: it neither deletes the files it moved back nor fails on the move done already."""
    task_id = _ended_task_with_changes(lbox, state=State.FAILED)
    lifecycle.release_ended()  # sealed
    task = Task.objects.get(pk=task_id)
    _move(task, State.QUEUED)
    _reopen(task, Layer.objects.get(task_id=task_id))  # the retry's start sets the layer aside (REOPENED)
    _move(Task.objects.get(pk=task_id), State.FAILED)  # and its run died before the view was made
    directory = paths.layer_dir(task_id)
    aside = directory / REOPENED
    assert (aside / "upper").is_dir()
    shutil.rmtree(directory / "upper")
    os.rename(aside / "upper", directory / "upper")  # the restore's first step, then the crash
    lifecycle.release_ended()
    assert not aside.exists()
    _move(Task.objects.get(pk=task_id), State.QUEUED)  # retried again: its view holds all it did
    view = open_view(Task.objects.get(pk=task_id))
    assert (view / "edit.txt").read_text() == "new\n" and (view / "top.txt").read_text() == "top\n"
    assert (view / "new" / "deep" / "file.txt").read_text() == "made\n" and os.readlink(view / "link") == "top.txt"
    assert not (view / "gone.txt").exists() and not (view / "olddir").exists()

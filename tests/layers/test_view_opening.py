"""A view's opening writes nothing durable of its own: what recovery needs of an unsealed layer
is its upper directory (or image) and the layer row, and the seal writes the layer's first meta,
durably. So a run cut off before its seal (a crash, a stop) is opened again, and later sealed,
as before."""
from __future__ import annotations

import os
import threading
from typing import Any

from tasks import services
from tasks.layers import disk, paths, task_view
from tasks.layers.tree import Meta
from tasks.models import Task, Workspace
from tasks.run import lifecycle
from tasks.states import State
from tests.conftest import Box


def _running_task(box: Box, title: str) -> Task:
    task = Task.objects.create(owner=box.owner, title=title, workspace=Workspace.objects.get(name="home"), worker="flow")
    services.transition(task, State.RUNNING)
    return Task.objects.select_related("workspace").get(pk=task.pk)


def _fsyncs_during(action: Any, monkeypatch: Any) -> int:
    """The ``fsync`` calls ``action`` makes on this thread (a spare image's maker beside it is not the start)."""
    calls: list[int] = []
    fsync, here = os.fsync, threading.get_ident()

    def counting(fd: int) -> None:
        if threading.get_ident() == here:
            calls.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)
    action()
    monkeypatch.setattr(os, "fsync", fsync)
    return len(calls)


def test_a_run_cut_off_before_its_seal_opens_again_and_its_seal_is_durable(lbox: Box, driver: str, monkeypatch: Any) -> None:
    (lbox.home / "base.txt").write_text("base\n")
    task = _running_task(lbox, "cut off")
    # the copy driver's snapshot of the working copy (its manifest) is the one kept
    assert _fsyncs_during(lambda: lifecycle.prepare(task), monkeypatch) == (1 if driver == "copy" else 0)
    (paths.view_dir(task.pk) / "made.txt").write_text("run 1\n")
    imaged = disk.limited(task.pk)

    # Cut off: nothing of the view is left mounted (as after a crash and the start-up's
    # reconcile), and the opening wrote no meta a crash could lose.
    task_view._unmount(task.pk)
    task_view._remove_view(task.pk)
    assert not (paths.layer_dir(task.pk) / "meta.json").exists()

    lifecycle.prepare(Task.objects.select_related("workspace").get(pk=task.pk))
    view = paths.view_dir(task.pk)
    assert (view / "made.txt").read_text() == "run 1\n" and (view / "base.txt").read_text() == "base\n"
    assert disk.limited(task.pk) == imaged  # a layer begun without an image stays without one, and the other way round

    Task.objects.filter(pk=task.pk).update(state=State.DONE)
    task_view.on_final_move(Task.objects.get(pk=task.pk), State.DONE)
    assert lifecycle.release(task.pk)
    meta = Meta.load(paths.layer_dir(task.pk))
    assert meta.sealed and meta.driver == driver

    later = _running_task(lbox, "later")
    lifecycle.prepare(later)
    assert (paths.view_dir(later.pk) / "made.txt").read_text() == "run 1\n"
    assert later.layers == [task.pk]



def test_a_start_seals_a_stacked_layer_whose_release_has_not_run_and_then_looks_at_it_no_more(lbox: Box, monkeypatch: Any) -> None:
    """The rule that a layer joins no stack before its release is complete holds with the
    process's memory of final layers: only a layer found final is remembered."""
    first = _running_task(lbox, "ends, its release not run yet")
    lifecycle.prepare(first)
    (paths.view_dir(first.pk) / "first.txt").write_text("first\n")
    Task.objects.filter(pk=first.pk).update(state=State.DONE)
    task_view.on_final_move(Task.objects.get(pk=first.pk), State.DONE)
    assert not Meta.load(paths.layer_dir(first.pk)).sealed

    second = _running_task(lbox, "stacks on it")
    lifecycle.prepare(second)
    assert Meta.load(paths.layer_dir(first.pk)).sealed  # sealed before the second task's view was mounted
    assert (paths.view_dir(second.pk) / "first.txt").read_text() == "first\n"

    looked: list[str] = []
    seal_layer = task_view.seal_layer

    def counting(task_id: str, **options: Any) -> None:
        looked.append(task_id)
        seal_layer(task_id, **options)

    monkeypatch.setattr(task_view, "seal_layer", counting)
    third = _running_task(lbox, "stacks on it too")
    lifecycle.prepare(third)
    assert third.layers == [first.pk] and first.pk not in looked
    assert (paths.view_dir(third.pk) / "first.txt").read_text() == "first\n"

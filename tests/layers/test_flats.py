"""Flats built and found without the workspace lock: what keeps them, and what a sweep leaves."""
from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tasks.layers import compaction, task_view, workspaces
from tasks.layers import paths as layer_paths
from tasks.layers.base import driver_name, get_driver
from tasks.layers.locks import workspace_lock
from tasks.models import Layer, LayerState, Task, Workspace
from tasks.run import lifecycle
from tests.conftest import wait_for
from tests.factories import flow
from tests.layers.conftest import read
from tests.pauses.helpers import cont


def _done_tasks(lbox: Any, count: int) -> list[str]:
    done = []
    for n in range(count):
        task = lbox.create(title=f"t{n}", flow=flow({"write": {"path": f"f{n}.txt", "content": f"{n}\n"}}))
        task = lbox.wait_state(task["id"], "done", "failed")
        assert task["state"] == "done", task["error"]
        done.append(task["id"])
    assert lifecycle.janitor.drain()
    return done


def test_a_flat_a_start_found_without_the_lock_is_not_swept_before_its_task_mounts_it(lbox, settings, monkeypatch):
    """The start picks its flat with no workspace lock; a refresh whose stack needs another flat
    runs in the gap between the pick and the mount: the flat stays, because the start recorded
    its stack (under the lock) before it picked."""
    settings.BOX_LAYER_MAX_DEPTH = 2
    done = _done_tasks(lbox, 4)
    workspace = Workspace.objects.get(name="home")
    picked: list[Path] = []
    lower_trees = compaction.lower_trees

    def then_refresh_with_another_stack(ws: Workspace, newest_first: list[str], markers: str) -> Any:
        trees = lower_trees(ws, newest_first, markers)
        if not picked:
            picked.append(trees[-2].root.parent)  # the flat, just above the base
            Layer.objects.filter(task_id=done[-1]).update(state=LayerState.DISCARDED)  # the stack changes
            task_view.refresh_workspace(ws)
            assert task_view.current_stack(ws) == list(reversed(done[:-1]))
            assert (picked[0] / "ids.json").exists()
        return trees

    monkeypatch.setattr(compaction, "lower_trees", then_refresh_with_another_stack)
    check = lbox.create(title="check", flow=flow({"run": "cat f0.txt f1.txt f3.txt > all.out"}))
    check = lbox.wait_state(check["id"], "done", "failed")
    assert check["state"] == "done", check["error"]
    assert picked and picked[0].parent == layer_paths.flats_dir(workspace.pk)
    assert read(lbox, "all.out") == "0\n1\n3\n"
    assert lifecycle.janitor.drain()


def test_a_flat_being_built_is_not_swept_and_two_builders_get_one_flat(lbox, settings, monkeypatch):
    settings.BOX_LAYER_MAX_DEPTH = 2
    done = _done_tasks(lbox, 3)
    workspace = Workspace.objects.get(name="home")
    root = layer_paths.flats_dir(workspace.pk)
    build, held = compaction._new_build(root, "k")
    try:
        with workspace_lock(workspace.pk):
            compaction.sweep_flats(workspace, set())
        assert build.is_dir()  # held by its builder
    finally:
        os.close(held)
    with workspace_lock(workspace.pk):
        compaction.sweep_flats(workspace, set())
    assert not build.exists()  # a build nobody holds (its builder died) goes

    markers = get_driver(driver_name()).markers
    inside = list(done)  # every layer, oldest first: a flat no refresh built
    both_built = threading.Barrier(2)
    write_atomically = compaction.write_atomically

    def once_both_built(path: Path, data: bytes) -> None:
        both_built.wait(timeout=20)  # neither renames before the other's build is complete
        write_atomically(path, data)

    monkeypatch.setattr(compaction, "write_atomically", once_both_built)
    built: list[Path] = []

    def build_it() -> None:
        built.append(compaction.ensure_flat(workspace, inside, markers))

    builders = [threading.Thread(target=build_it) for _ in range(2)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(timeout=30)
    assert not both_built.broken
    assert len(built) == 2 and built[0] == built[1]
    assert json.loads((built[0] / "ids.json").read_text()) == inside
    assert sorted(p.name for p in (built[0] / "upper").iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]
    assert not [p for p in root.iterdir() if p.name.startswith(".build-")]


def test_a_failed_build_leaves_nothing_behind(lbox, settings, monkeypatch):
    settings.BOX_LAYER_MAX_DEPTH = 2
    done = _done_tasks(lbox, 3)
    workspace = Workspace.objects.get(name="home")

    def out_of_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compaction, "apply_layer", out_of_space)
    with pytest.raises(OSError):
        compaction.ensure_flat(workspace, list(done), get_driver(driver_name()).markers)
    assert not [p for p in layer_paths.flats_dir(workspace.pk).iterdir() if p.name.startswith(".build-")]


def test_a_sweep_passes_over_a_stray_file_among_the_flats(lbox, settings):
    settings.BOX_LAYER_MAX_DEPTH = 2
    done = _done_tasks(lbox, 3)
    workspace = Workspace.objects.get(name="home")
    root = layer_paths.flats_dir(workspace.pk)
    flat = compaction.ensure_flat(workspace, list(done), get_driver(driver_name()).markers)
    (root / "stray").write_text("not a flat\n")
    with workspace_lock(workspace.pk):
        compaction.sweep_flats(workspace, set())
    assert not flat.exists()



def test_a_flat_is_built_past_strays_that_name_no_layers(lbox, settings):
    """What the flats directory holds that the box did not write (an empty or malformed list of
    layers, a directory where the list goes) covers nothing: a build takes the layers instead."""
    settings.BOX_LAYER_MAX_DEPTH = 2
    done = _done_tasks(lbox, 3)
    workspace = Workspace.objects.get(name="home")
    root = layer_paths.private_dir(layer_paths.flats_dir(workspace.pk))
    for name, ids in (("empty", "[]"), ("not-a-list", '{"a": 1}'), ("numbers", "[1, 2]"), ("broken", "[")):
        (root / name).mkdir()
        (root / name / "ids.json").write_text(ids)
    (root / "a-directory" / "ids.json").mkdir(parents=True)
    flat = compaction.ensure_flat(workspace, list(done), get_driver(driver_name()).markers)
    assert sorted(p.name for p in (flat / "upper").iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]

def test_a_refresh_keeps_the_flat_of_a_stack_that_changed_before_its_lock(lbox, settings, monkeypatch):
    """The refresh read the stack of 4 layers; before it takes the lock, the newest is undone and
    the stack of 3's flat is built: the sweep keeps that flat, which the next start mounts."""
    settings.BOX_LAYER_MAX_DEPTH = 2
    done = _done_tasks(lbox, 4)
    workspace = Workspace.objects.get(name="home")
    markers = get_driver(driver_name()).markers
    _, [next_flat] = compaction.split(list(reversed(done[:-1])), markers)
    sweep_wanted = compaction.sweep_wanted

    def after_the_stack_changed(ws: Workspace, keep: set[str]) -> bool:
        if Layer.objects.filter(task_id=done[-1], state=LayerState.APPLIED).update(state=LayerState.DISCARDED):
            compaction.ensure_flat(ws, next_flat.layers, markers)  # as a start or another refresh would
        return sweep_wanted(ws, keep)

    monkeypatch.setattr(compaction, "sweep_wanted", after_the_stack_changed)
    task_view.refresh_workspace(workspace)
    assert task_view.current_stack(workspace) == list(reversed(done[:-1]))
    assert (layer_paths.flats_dir(workspace.pk) / next_flat.key / "ids.json").exists()


def test_a_browse_holds_its_flat_against_a_sweep(lbox, settings):
    settings.BOX_LAYER_MAX_DEPTH = 2
    _done_tasks(lbox, 4)
    workspace = Workspace.objects.get(name="home")
    with workspaces.view_of(workspace) as view:
        with workspace_lock(workspace.pk):
            compaction.sweep_flats(workspace, set())  # a sweep whose stack is another
        found = view.lookup("f0.txt")
        assert found is not None and found.path is not None
        assert found.path.read_text() == "0\n"


def test_a_refresh_with_nothing_to_sweep_does_not_wait_for_the_workspace_lock(lbox, settings):
    settings.BOX_LAYER_MAX_DEPTH = 2
    _done_tasks(lbox, 4)
    workspace = Workspace.objects.get(name="home")
    finished = threading.Event()

    def refresh() -> None:
        try:
            task_view.refresh_workspace(Workspace.objects.get(pk=workspace.pk))
            finished.set()
        finally:
            connection.close()

    with workspace_lock(workspace.pk):  # as a start recording its stack holds it
        refresher = threading.Thread(target=refresh)
        refresher.start()
        wait_for(lambda: finished.is_set() or None, timeout=20, what="the refresh to complete")
    refresher.join(timeout=10)



def test_the_one_flat_an_older_worker_mounted_stays_while_its_task_is_active(lbox, settings):
    """A worker of the version before runs mounted one flat over every layer below the split.
    While its task is active, a sweep by this version keeps that flat; once it ended, it goes."""
    settings.BOX_LAYER_MAX_DEPTH = 4
    _done_tasks(lbox, 7)
    task = lbox.create(title="held", flow=flow({"checkpoint": "go on"}, {"run": "cat f0.txt f6.txt > seen.out"}))
    lbox.wait_state(task["id"], "waiting")
    workspace = Workspace.objects.get(name="home")
    markers = get_driver(driver_name()).markers
    stack = Task.objects.get(pk=task["id"]).layers
    own, flats = compaction.split(stack, markers)
    assert len(flats) == 2  # runs of 4 and 2 layers: neither is the one flat of 6
    one_flat = compaction.ensure_flat(workspace, list(reversed(stack))[:6], markers)  # as that worker built it
    assert one_flat.name in compaction.mounted_keys(stack, markers) - {flat.key for flat in flats}

    task_view.refresh_workspace(workspace)
    assert (one_flat / "ids.json").exists()
    assert cont(lbox, task["id"], approve=True).status_code == 200
    assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert read(lbox, "seen.out") == "0\n6\n"
    assert lifecycle.janitor.drain()
    task_view.refresh_workspace(workspace)
    assert not one_flat.exists()

@pytest.mark.parametrize("depth", [3, 4, 8, 16])
def test_flats_are_runs_whose_rebuilds_copy_each_layer_a_logarithmic_number_of_times(settings, depth):
    """One flat over every old layer would be built again at each step of the split, each time
    a copy of every old task's files. The runs (binary digits of the flattened steps) keep the
    mounted depth within ``BOX_LAYER_MAX_DEPTH`` and, at the default depth, the layers copied
    into new flats over a workspace's life near n log n (one flat: n² / step)."""
    settings.BOX_LAYER_MAX_DEPTH = depth
    history = [f"t{n}" for n in range(2048)]
    built: set[str] = set()
    copied = one_flat_copied = 0
    for count in range(1, len(history) + 1):
        newest_first = history[:count][::-1]
        own, flats = compaction.split(newest_first, "native")
        assert len(own) + len(flats) <= depth
        assert own + compaction.layers_inside(flats) == newest_first
        assert all(flat.key == compaction.flat_key(flat.layers, "native") for flat in flats)
        copied += sum(len(flat.layers) for flat in flats if flat.key not in built)
        built |= {flat.key for flat in flats}
        flattened = compaction.flattened_count(count)
        if flattened != compaction.flattened_count(count - 1):
            one_flat_copied += flattened
    assert copied * 2 <= one_flat_copied
    if depth == 16:
        levels = (len(history) // (depth // 2)).bit_length() + 1
        assert copied <= len(history) * levels, (copied, one_flat_copied)

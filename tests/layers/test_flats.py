"""Flats built and found without the workspace lock: what keeps them, and what a sweep leaves."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from django.db import connection

from tasks import lifecycle
from tasks.layers import compaction, task_view
from tasks.layers import paths as layer_paths
from tasks.layers.base import driver_name, get_driver
from tasks.layers.locks import workspace_lock
from tasks.models import Layer, LayerState, Workspace
from tests.conftest import wait_for
from tests.factories import flow
from tests.layers.conftest import read


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


def test_a_flat_being_built_is_not_swept_and_two_builders_get_one_flat(lbox, settings):
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
    start = threading.Barrier(2)
    built: list[Path] = []

    def build_it() -> None:
        start.wait(timeout=10)
        built.append(compaction.ensure_flat(workspace, inside, markers))

    builders = [threading.Thread(target=build_it) for _ in range(2)]
    for builder in builders:
        builder.start()
    for builder in builders:
        builder.join(timeout=30)
    assert len(built) == 2 and built[0] == built[1]
    assert compaction._read_ids(built[0]) == inside
    assert sorted(p.name for p in (built[0] / "upper").iterdir()) == ["f0.txt", "f1.txt", "f2.txt"]
    assert not [p for p in root.iterdir() if p.name.startswith(".build-")]


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

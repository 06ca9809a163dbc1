"""A start beside a seal still in progress: a layer whose task finished after the
starting task was created, and whose seal is not complete, is left out of its stack, unless the
task depends on that task; the start neither waits for that seal nor does it. A layer done
before the task was created, or a dependency's, is waited for and seen.

The janitor is kept from the layers (``layers.release`` does nothing until the test puts it
back) and another thread holds the finished layer's lock, as a janitor in the middle of its seal
does: a start that waits for that layer waits for that thread."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction

from tasks import dependencies, layers
from tasks.layers import compaction
from tasks.layers import paths as layer_paths
from tasks.layers.base import driver_name, get_driver
from tasks.layers.locks import layer_lock
from tasks.layers.tree import Meta
from tasks.models import Layer, Task
from tasks.run import lifecycle
from tests.conftest import wait_for
from tests.factories import flow
from tests.layers.conftest import no_seal_beside_the_finish, read, undo
from tests.pauses.helpers import cont

SEES_A = {"run": "if [ -e a.txt ]; then cat a.txt; else echo missing; fi > seen.txt"}


def waiting(lbox, title: str, *steps: dict[str, Any], **extra: Any) -> str:
    """A task started and waiting at a checkpoint, then ``steps``: its id."""
    task = lbox.create(title=title, flow=flow({"checkpoint": "go on"}, *steps), **extra)
    lbox.wait_state(task["id"], "waiting")
    return task["id"]


def finish(lbox, task_id: str) -> dict[str, Any]:
    assert cont(lbox, task_id, approve=True).status_code == 200
    task = lbox.wait_state(task_id, "done", "failed")
    assert task["state"] == "done", task["error"]
    return task


def in_state(task_id: str, *states: str) -> Callable[[], bool]:
    return lambda: Task.objects.filter(pk=task_id, state__in=states).exists()


def sealed(task_id: str) -> bool:
    return Meta.load(layer_paths.layer_dir(task_id)).sealed


class HeldLayer:
    """Another thread holds ``task_id``'s layer lock until ``until()`` holds (read from that
    thread) or 15 s pass. ``let_go_when_asked``: it was ``until`` that let it go."""

    def __init__(self, task_id: str, until: Callable[[], bool]) -> None:
        self.task_id, self.until = task_id, until
        self.let_go_when_asked = False
        self.holding = threading.Event()
        self.thread = threading.Thread(target=self._hold, name="held-layer")

    def _hold(self) -> None:
        try:
            with layer_lock(self.task_id):
                self.holding.set()
                try:
                    wait_for(self.until, timeout=15, what="the condition that lets the layer go")
                    self.let_go_when_asked = True
                except AssertionError:
                    pass  # let go at the deadline: the test's assertions say what waited
        finally:
            connection.close()  # this thread's own


@contextmanager
def held_layer(task_id: str, until: Callable[[], bool]) -> Iterator[HeldLayer]:
    held = HeldLayer(task_id, until)
    held.thread.start()
    assert held.holding.wait(10), "the layer's lock was not taken"
    try:
        yield held
    finally:
        held.thread.join(30)
        assert not held.thread.is_alive()


@contextmanager
def janitor_kept_from_the_layers(monkeypatch) -> Iterator[None]:
    """Ended tasks' layers are left unsealed (their processes are stopped, their users given
    back); on leaving, the janitor's work is put back and done. Nor are they sealed beside their
    finish."""
    no_seal_beside_the_finish(monkeypatch)
    release = layers.release
    monkeypatch.setattr(layers, "release", lambda *args, **kwargs: None)
    try:
        yield
    finally:
        assert lifecycle.janitor.drain()
        monkeypatch.setattr(layers, "release", release)


def overrides_of(lbox, task_id: str) -> list[dict[str, Any]]:
    return [e for e in lbox.events(task_id) if e["kind"] == "note" and "overrides" in e["data"]]


def test_an_independent_task_created_before_a_layer_finished_starts_without_it_and_without_waiting(lbox, monkeypatch):
    gate = waiting(lbox, "gate")
    a = waiting(lbox, "A", {"write": {"path": "a.txt", "content": "A\n"}}, {"write": {"path": "both.txt", "content": "A\n"}})
    b = lbox.create(title="B", dependsOn=[gate], flow=flow(SEES_A, {"write": {"path": "both.txt", "content": "B\n"}}))["id"]
    with janitor_kept_from_the_layers(monkeypatch):
        finish(lbox, a)  # after B was created; its layer is not sealed
        assert not sealed(a) and not Layer.objects.get(task_id=a).sealed
        with held_layer(a, until=in_state(b, "done", "failed")) as held:
            finish(lbox, gate)  # B starts now, while A's layer is mid-release
            b_task = lbox.wait_state(b, "done", "failed")
        assert b_task["state"] == "done", b_task["error"]
        assert held.let_go_when_asked, "B's start waited for A's seal"
        assert b_task["layers"] == [gate]  # A's layer left out; the gate is a dependency
        assert not sealed(a), "B's start sealed A's layer"

    # B's release first (a browse would seal A's layer too): its note seals A's layer for its paths
    assert lifecycle.release(b) and sealed(a) and Layer.objects.get(task_id=a).sealed
    assert lifecycle.release(a) and lifecycle.release(gate)
    assert read(lbox, "seen.txt") == "missing\n"  # B's view did not show A's file
    assert read(lbox, "both.txt") == "B\n" and read(lbox, "a.txt") == "A\n"  # the last to finish wins
    notes = overrides_of(lbox, b)
    assert len(notes) == 1 and notes[0]["data"]["overrides"] == {a: ["both.txt"]}, notes
    assert "tasks that ended after it was created (their work was not in its view)" in notes[0]["summary"]
    assert f"both.txt from task {a}" in notes[0]["summary"]
    assert overrides_of(lbox, a) == []
    assert Task.objects.get(pk=b).layers == [gate]  # recorded once: A's layer never joins B's view

    undo(lbox, b)  # the earlier task's version comes back
    assert lifecycle.janitor.drain()
    assert read(lbox, "both.txt") == "A\n" and read(lbox, "seen.txt") is None


def test_a_task_created_after_the_layer_finished_waits_for_its_seal_and_sees_it(lbox, monkeypatch):
    a = waiting(lbox, "A", {"write": {"path": "a.txt", "content": "A\n"}})
    with janitor_kept_from_the_layers(monkeypatch):
        finish(lbox, a)
        assert not sealed(a)
        running = lambda: Task.objects.filter(title="C", state="running").exists()  # noqa: E731 - read by the holder
        with held_layer(a, until=running) as held:
            c = lbox.create(title="C", flow=flow(SEES_A))["id"]  # starts at once, and stops at A's lock
            c_task = lbox.wait_state(c, "done", "failed")
        assert c_task["state"] == "done", c_task["error"]
        assert held.let_go_when_asked  # C was running, its start at A's layer, while the lock was held
        assert c_task["layers"] == [a] and sealed(a)  # sealed by C's start, once the lock was free
        assert read(lbox, "seen.txt") == "A\n"


def test_a_dependent_created_before_its_dependency_finished_waits_for_its_seal_and_sees_it(lbox, monkeypatch):
    gate = waiting(lbox, "gate")
    a = waiting(lbox, "A", {"write": {"path": "a.txt", "content": "A\n"}})
    d = lbox.create(title="D", dependsOn=[{"task": a, "condition": "completion"}, {"task": gate}], flow=flow(SEES_A))["id"]
    with janitor_kept_from_the_layers(monkeypatch):
        finish(lbox, a)  # D still waits for the gate
        assert not sealed(a) and Task.objects.get(pk=d).state == "queued"
        with held_layer(a, until=in_state(d, "running", "done", "failed")) as held:
            finish(lbox, gate)
            d_task = lbox.wait_state(d, "done", "failed")
        assert d_task["state"] == "done", d_task["error"]
        assert held.let_go_when_asked
        assert set(d_task["layers"]) == {a, gate} and sealed(a)
        assert read(lbox, "seen.txt") == "A\n"


def test_a_layer_that_finished_after_the_task_was_created_is_in_its_stack_once_sealed(lbox):
    gate = waiting(lbox, "gate")
    a = waiting(lbox, "A", {"write": {"path": "a.txt", "content": "A\n"}})
    b = lbox.create(title="B", dependsOn=[gate], flow=flow(SEES_A))["id"]
    finish(lbox, a)
    assert lifecycle.janitor.drain()  # A's release sealed its layer before B starts
    assert Layer.objects.get(task_id=a).sealed
    finish(lbox, gate)
    b_task = lbox.wait_state(b, "done", "failed")
    assert b_task["state"] == "done", b_task["error"]
    assert a in b_task["layers"] and read(lbox, "seen.txt") == "A\n"


def test_a_retry_keeps_the_stack_that_left_the_layer_out(lbox, monkeypatch):
    gate = waiting(lbox, "gate")
    a = waiting(lbox, "A", {"write": {"path": "a.txt", "content": "A\n"}})
    b = lbox.create(title="B", dependsOn=[gate], limits={"max_actions": 1}, flow=flow(
        {"run": "echo one > first.txt"}, SEES_A))["id"]
    with janitor_kept_from_the_layers(monkeypatch):
        finish(lbox, a)
        finish(lbox, gate)
        failed = lbox.wait_state(b, "failed")
        assert "limits.max_actions" in failed["hint"], failed
        assert failed["layers"] == [gate]
    assert lifecycle.release(b) and lifecycle.release(a) and lifecycle.release(gate)
    assert sealed(a)  # sealed now: a new start would stack it, B's retry does not
    response = lbox.api.post(f"/api/tasks/{b}/retry", {"limits": {"max_actions": 2}}, format="json")
    assert response.status_code == 200, response.json()
    b_task = lbox.wait_state(b, "done", "failed")
    assert b_task["state"] == "done", b_task["error"]
    assert b_task["layers"] == [gate] and read(lbox, "seen.txt") == "missing\n"


def test_a_stack_that_skips_a_layer_gets_a_flat_of_its_own_which_the_sweep_keeps_while_it_runs(lbox, settings, monkeypatch):
    """Flats are keyed by the layers they hold: a stack without a layer between two it holds has
    a flat no other stack has. The janitor's refresh (its stack holds that layer) keeps it while
    the task is active, and an undo of the skipped layer deletes it, as nobody reads it."""
    settings.BOX_LAYER_MAX_DEPTH = 3  # flats of all but the newest layer
    for n in range(2):
        task = lbox.create(title=f"x{n}", flow=flow({"write": {"path": f"x{n}.txt", "content": f"{n}\n"}}))
        assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
    gate = waiting(lbox, "gate")
    skipped = waiting(lbox, "skipped", {"write": {"path": "a.txt", "content": "A\n"}})
    kept = waiting(lbox, "kept", {"write": {"path": "k.txt", "content": "K\n"}})
    checks = {"run": "cat x0.txt x1.txt k.txt > kept.out && test ! -e a.txt"}
    b = lbox.create(title="B", dependsOn=[gate], flow=flow(checks, {"checkpoint": "hold"}, checks))["id"]
    release = layers.release
    monkeypatch.setattr(layers, "release", lambda task_id, **kwargs: None if task_id == skipped else release(task_id, **kwargs))
    no_seal_beside_the_finish(monkeypatch)
    finish(lbox, skipped)  # its layer is left unsealed
    with held_layer(skipped, until=in_state(b, "waiting", "done", "failed")) as held:
        finish(lbox, kept)  # its release seals it, then waits for the skipped layer (its note, its refresh)
        wait_for(lambda: sealed(kept), what="the kept layer's seal")
        finish(lbox, gate)
        lbox.wait_state(b, "waiting", "failed")
    assert held.let_go_when_asked
    monkeypatch.setattr(layers, "release", release)
    stack = Task.objects.get(pk=b).layers
    assert skipped not in stack and kept in stack
    markers = get_driver(driver_name()).markers
    [flat] = [flat for flat in compaction.split(stack, markers)[1] if kept in flat.layers]  # newer than the one skipped
    flats = layer_paths.flats_dir(Task.objects.get(pk=b).workspace_id)
    assert lifecycle.janitor.drain()  # the kept task's refresh: a flat of the current stack, and a sweep
    assert lifecycle.release(skipped)
    assert (flats / flat.key / "ids.json").exists(), "the sweep took the flat of an active task's stack"

    undo(lbox, skipped)
    assert lifecycle.janitor.drain()
    assert not layer_paths.layer_dir(skipped).exists()  # B never read it
    b_task = finish(lbox, b)  # its second run opens its view over the same flat
    assert b_task["layers"] == stack
    assert read(lbox, "kept.out") == "0\n1\nK\n" and read(lbox, "a.txt") is None


def test_a_seal_whose_row_was_rolled_back_with_a_savepoint_is_written_again_by_the_next_artifact_check(lbox, monkeypatch):
    """A dependent's verdict seals an artifact's layer inside the dependent's savepoint, and
    that decision can be rolled back and taken again with more locks: the meta stays sealed, the
    row's manifest and ``sealed`` went with the savepoint. Left so, the layer would be left out
    for good of every stack whose task was created before it finished, and notes would find no
    paths of it. The next artifact check writes the row again."""
    a = waiting(lbox, "A", {"write": {"path": "out/report.txt", "content": "A\n"}})
    with janitor_kept_from_the_layers(monkeypatch):
        finish(lbox, a)
        assert not sealed(a)

        class RolledBack(Exception):
            pass

        try:
            with transaction.atomic():
                layers.task_view.seal_layer(a)  # as the verdict's artifact_present does
                raise RolledBack
        except RolledBack:
            pass
        row = Layer.objects.get(task_id=a)
        assert sealed(a) and not row.sealed and row.manifest == {}  # the row's part gone

        assert dependencies.artifact_present(a, "out/report.txt")

        row = Layer.objects.get(task_id=a)
        assert row.sealed and "out/report.txt" in [p["path"] for p in row.manifest["paths"]], row.manifest

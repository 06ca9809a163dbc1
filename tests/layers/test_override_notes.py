"""The override note of a task that finished over tasks that ended while it ran ("the last to
finish wins") is written after its layer's seal, outside the layer's lock: a start that stacks
the layer does not wait for it, and a crash between the seal and the note leaves it due for
start-up reconcile, which writes it once."""
from __future__ import annotations

import threading
from typing import Any

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from tasks import layers
from tasks.layers import paths as layer_paths
from tasks.layers import task_view
from tasks.layers.tree import LayerTree, Meta
from tasks.models import Layer, Task
from tasks.run import lifecycle
from tests.factories import flow
from tests.layers.conftest import no_seal_beside_the_finish, read
from tests.layers.test_owner_files import finished
from tests.pauses.helpers import cont


def overlapping(lbox) -> tuple[str, str]:
    """A slow task writes both.txt over the stack as it was before a fast task wrote it too:
    (slow's id, fast's id), the slow task waiting to go on."""
    slow = lbox.create(title="slow", flow=flow({"checkpoint": "look first"},
                                               {"write": {"path": "both.txt", "content": "slow\n"}}))
    lbox.wait_state(slow["id"], "waiting")
    fast = finished(lbox, flow({"write": {"path": "both.txt", "content": "fast\n"}}))
    assert lifecycle.janitor.drain()
    return slow["id"], fast["id"]


def finish(lbox, task_id: str) -> None:
    assert cont(lbox, task_id, approve=True).status_code == 200
    task = lbox.wait_state(task_id, "done", "failed")
    assert task["state"] == "done", task["error"]


def override_notes(lbox, task_id: str) -> list[dict[str, Any]]:
    return [e for e in lbox.events(task_id) if e["kind"] == "note" and "overrides" in e["data"]]


def test_a_crash_between_the_seal_and_the_note_leaves_it_due_and_reconcile_writes_it_once(lbox, monkeypatch):
    slow, fast = overlapping(lbox)

    class Crash(Exception):
        pass

    def crashed(*args: Any, **kwargs: Any) -> None:
        raise Crash("the process died here")  # after the seal: where a crash leaves the note unwritten

    original = task_view.note_overrides
    monkeypatch.setattr(task_view, "note_overrides", crashed)
    monkeypatch.setattr(lifecycle, "RELEASE_RETRY_S", ())
    finish(lbox, slow)
    assert lifecycle.janitor.drain()
    monkeypatch.setattr(task_view, "note_overrides", original)

    assert Meta.load(layer_paths.layer_dir(slow)).sealed  # a start stacking it goes on
    assert Layer.objects.get(task_id=slow).note_due and override_notes(lbox, slow) == []

    layers.write_due_notes()  # the recovery step, on its own
    notes = override_notes(lbox, slow)
    assert len(notes) == 1 and notes[0]["data"]["overrides"] == {fast: ["both.txt"]}
    assert not Layer.objects.get(task_id=slow).note_due

    lifecycle.release_ended()  # start-up reconcile again: the release left undone, the due notes
    lifecycle.release_ended()
    assert len(override_notes(lbox, slow)) == 1


def test_a_release_cut_short_after_the_seal_writes_the_note_once_when_released_again(lbox, monkeypatch):
    slow, fast = overlapping(lbox)
    originals = task_view.note_overrides, task_view._remove_view
    # what a process that died after the seal leaves: no note, the view still there
    monkeypatch.setattr(task_view, "note_overrides", lambda *args, **kwargs: None)
    monkeypatch.setattr(task_view, "_remove_view", lambda task_id: None)
    finish(lbox, slow)
    assert lifecycle.janitor.drain()
    monkeypatch.setattr(task_view, "note_overrides", originals[0])
    monkeypatch.setattr(task_view, "_remove_view", originals[1])
    assert override_notes(lbox, slow) == []

    lifecycle.release_ended()  # the view left behind: the task is released again, and noted
    assert [n["data"]["overrides"] for n in override_notes(lbox, slow)] == [{fast: ["both.txt"]}]
    lifecycle.release(slow)
    layers.write_due_notes()
    assert len(override_notes(lbox, slow)) == 1


def test_a_start_that_stacks_the_layer_does_not_wait_for_its_note(lbox, monkeypatch):
    slow, fast = overlapping(lbox)
    writing, go, written = threading.Event(), threading.Event(), threading.Event()
    original = task_view.note_overrides

    def held(*args: Any, **kwargs: Any) -> None:
        writing.set()
        go.wait(timeout=20)  # written under the layer's lock, the note would make the next start wait this long
        original(*args, **kwargs)
        written.set()

    monkeypatch.setattr(task_view, "note_overrides", held)
    try:
        finish(lbox, slow)
        assert writing.wait(timeout=30), "the release never came to the note"
        after = finished(lbox, flow({"write": {"path": "after.txt", "content": "after\n"}}))  # stacks slow's layer
        assert not written.is_set(), "the next task's start waited for the override note"
        assert read(lbox, "both.txt") == "slow\n" and read(lbox, "after.txt") == "after\n"
    finally:
        go.set()
    assert lifecycle.janitor.drain()
    notes = override_notes(lbox, slow)
    assert len(notes) == 1 and notes[0]["data"]["overrides"] == {fast: ["both.txt"]}
    assert override_notes(lbox, after["id"]) == []
    assert not Layer.objects.filter(note_due=True).exists()


def test_two_writers_of_one_due_note_write_it_once(lbox, monkeypatch):
    slow, fast = overlapping(lbox)
    original = task_view.note_overrides
    monkeypatch.setattr(task_view, "note_overrides", lambda *args, **kwargs: None)  # left due, as a crash leaves it
    finish(lbox, slow)
    assert lifecycle.janitor.drain()
    monkeypatch.setattr(task_view, "note_overrides", original)

    both = threading.Barrier(2, timeout=30)
    of_layer = LayerTree.of_layer
    # each writer has read the note due before either writes it (a release and reconcile at once)
    monkeypatch.setattr(LayerTree, "of_layer", staticmethod(lambda directory: (both.wait(), of_layer(directory))[1]))
    failed: list[BaseException] = []

    def write() -> None:
        try:
            task_view.note_overrides(Task.objects.get(pk=slow), Layer.objects.get(task_id=slow), found_due=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)
        finally:
            connection.close()

    writers = [threading.Thread(target=write) for _ in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert not failed and not any(writer.is_alive() for writer in writers)
    assert [n["data"]["overrides"] for n in override_notes(lbox, slow)] == [{fast: ["both.txt"]}]
    assert not Layer.objects.filter(note_due=True).exists()


def test_a_seal_inside_another_transaction_writes_the_note_when_that_commits(lbox, monkeypatch):
    """A dependency's check can seal the layer inside its own transaction while the task's
    release runs: that release finds the layer sealed before the flag is committed, and writes
    no note. The note then comes with the commit, once."""
    slow, _ = overlapping(lbox)
    release = layers.release
    monkeypatch.setattr(layers, "release", lambda *args, **kwargs: None)  # the janitor has not got to it yet
    no_seal_beside_the_finish(monkeypatch)  # nor the sealer
    finish(lbox, slow)
    assert lifecycle.janitor.drain()
    monkeypatch.setattr(layers, "release", release)
    assert not Meta.load(layer_paths.layer_dir(slow)).sealed
    failed: list[BaseException] = []

    def janitor() -> None:
        try:
            task_view.release(slow)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)
        finally:
            connection.close()  # this thread's own

    with transaction.atomic():  # the dependency check's transaction
        task_view.seal_layer(slow)
        thread = threading.Thread(target=janitor)
        thread.start()
        thread.join(60)
    assert not thread.is_alive() and not failed, failed
    assert len(override_notes(lbox, slow)) == 1
    assert not Layer.objects.get(task_id=slow).note_due
    task_view.write_due_notes()
    assert len(override_notes(lbox, slow)) == 1


def test_a_seal_and_its_note_never_name_the_layers_its_task_stacked(lbox, monkeypatch):
    """The layers applied before a task was created are in its stack: the seal's look for layers
    applied while it ran names none of them, so it costs the same in a workspace of ten done tasks
    as in one of ten thousand (a statement naming each stacked layer grew with the history)."""
    history = [finished(lbox, flow({"write": {"path": f"old{i}.txt", "content": "old\n"}}))["id"] for i in range(3)]
    assert lifecycle.janitor.drain()
    slow, fast = overlapping(lbox)
    assert set(history) <= set(Task.objects.get(pk=slow).layers)
    release = layers.release
    monkeypatch.setattr(layers, "release", lambda *args, **kwargs: None)  # the janitor has not got to it yet
    finish(lbox, slow)
    assert lifecycle.janitor.drain()
    monkeypatch.setattr(layers, "release", release)

    with CaptureQueriesContext(connection) as queries:
        task_view.release(slow)

    statements = [q["sql"] for q in queries.captured_queries]
    assert not [sql for sql in statements if any(old in sql for old in history)], statements
    assert [n["data"]["overrides"] for n in override_notes(lbox, slow)] == [{fast: ["both.txt"]}]
    assert read(lbox, "both.txt") == "slow\n"

"""A task's move (``services.transition``, through ``sql.move_task``) leaves its row and its events
as the moves said: the fields written, the version and the events' numbers counted, the events
redacted and published after commit in the order of their numbers; and the finish's read of its
task (``runs.read_locked``) sees what the ORM's refresh sees."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.forms.models import model_to_dict

from boxsite.core.errors import Conflict
from tasks import events, services
from tasks.models import Task, TaskEvent
from tasks.run import leases as runs
from tasks.states import State
from tasks.vault.store import set_secret
from tests.conftest import queue_through_the_cluster

SECRET = "sk-live-moved-with-its-events-51a9"
KEPT_APART = {"id", "title", "user", "created_at", "updated_at", "started_at", "finished_at"}


def _queued(box: Any, title: str) -> Task:
    """A task created and left queued (its run on a queue nobody reads)."""
    view = box.create(title=title, flow={"steps": [{"write": {"path": "x", "content": "x"}}]})
    return Task.objects.get(pk=view["id"])


def _moves(task: Task) -> None:
    """A move with a note, one with a pause, and a version bump with a review, as a worker and an
    owner make them; the vault's secret in a summary and in an event's data."""
    services.transition(task, State.RUNNING, summary=f"running with {SECRET}", data={"run": 1},
                        notes=[("isolated", {"user": "box-1", "key": SECRET})])
    services.transition(task, State.WAITING, waiting_for="owner", pause={"message": "which one?", "fields": ["a"]},
                        step="asking", progress=0.5)
    services.transition(task, State.RUNNING, summary="running again", data={"run": 2})
    services.bump_version(task, "note", "kept", {"by": "owner"}, recoverable=True, hint="a hint")


def _state_of(task_id: str) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    row = model_to_dict(Task.objects.get(pk=task_id), exclude=list(KEPT_APART))
    row.update({name: getattr(Task.objects.get(pk=task_id), name) for name in ("event_seq", "version")})
    logged = list(TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list(
        "seq", "kind", "summary", "data", "cost_cents", "artifacts"))
    return row, logged


def test_a_tasks_moves_leave_its_row_and_its_log_as_the_moves_said(box: Any, settings: Any) -> None:
    queue_through_the_cluster(settings)
    set_secret("KEY", SECRET)
    task = _queued(box, "moved")
    version, seq = task.version, task.event_seq
    _moves(task)
    row, logged = _state_of(task.pk)
    assert row["state"] == State.RUNNING and row["version"] == version + 4 and row["event_seq"] == seq + 5
    assert (row["waiting_for"], row["pause"], row["step"], row["progress"]) == ("", {}, "asking", 0.5)
    assert (row["recoverable"], row["hint"]) == (True, "a hint")
    moved = logged[-5:]
    assert [number for number, *_ in moved] == list(range(seq + 1, seq + 6))
    assert [kind for _, kind, *_ in moved] == ["status", "note", "status", "status", "note"]
    assert [data.get("version") for *_, data, _, _ in moved] == [version + 1, None, version + 2, version + 3, version + 4]
    assert moved[1][2] == "isolated" and moved[4][2] == "kept" and moved[3][3]["run"] == 2
    assert SECRET not in str(logged)
    # the task in memory is the row as written
    stored = Task.objects.get(pk=task.pk)
    for field in Task._meta.concrete_fields:
        assert getattr(task, field.attname) == getattr(stored, field.attname), field.name


def test_a_moves_events_are_published_after_commit_in_the_order_of_their_numbers(box: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    queue_through_the_cluster(settings)
    task = _queued(box, "published")
    published: list[tuple[int, int, str]] = []
    monkeypatch.setattr(services, "publish_event", lambda task_id, owner_id, event_id, seq, kind: published.append((event_id, seq, kind)))
    with transaction.atomic():
        services.transition(task, State.RUNNING, notes=[("first note", {}), ("second note", {})])
        assert published == [], "nothing is published before the move commits"
    logged = list(TaskEvent.objects.filter(task=task, seq__gt=task.event_seq - 3).order_by("seq").values_list("pk", "seq", "kind"))
    assert published == logged and [kind for _, _, kind in logged] == ["status", "note", "note"]
    assert [pk for pk, _, _ in logged] == sorted(pk for pk, _, _ in logged)  # ids follow the numbers
    assert task.event_seq == logged[-1][1]
    assert events.publish_event is not services.publish_event  # the patch reached only the move's publisher


def test_a_move_after_another_writer_moved_the_task_writes_nothing(box: Any, settings: Any) -> None:
    queue_through_the_cluster(settings)
    task = _queued(box, "stale")
    Task.objects.filter(pk=task.pk).update(version=task.version + 1)
    before = _state_of(task.pk)
    with pytest.raises(Conflict):
        services.transition(task, State.RUNNING)
    assert _state_of(task.pk) == before
    assert task.state == State.QUEUED


def test_the_finishs_locked_read_sees_the_row_as_the_orm_reads_it_and_keeps_a_related_row_of_the_same_key(box: Any, settings: Any) -> None:
    queue_through_the_cluster(settings)
    task = _queued(box, "read again")
    held = Task.objects.get(pk=task.pk)
    services.transition(task, State.RUNNING, notes=[("isolated", {"user": "box-1"})])
    Task.objects.filter(pk=task.pk).update(spent={"actions": 3}, records={"k": [1, "v"]}, recoverable=False, progress=0.25)
    assert held.owner.pk == task.owner_id  # a related row cached before the read stays (its key did not change)
    with transaction.atomic():
        runs.read_locked(held)
    by_orm = Task.objects.get(pk=task.pk)
    for field in Task._meta.concrete_fields:
        assert getattr(held, field.attname) == getattr(by_orm, field.attname), field.name
    assert "owner" in held._state.fields_cache and held.state == State.RUNNING and held.spent == {"actions": 3}
    with pytest.raises(Task.DoesNotExist), transaction.atomic():
        runs.read_locked(Task(pk="no-such-task"))

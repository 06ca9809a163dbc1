"""A run's lease as the worker proves it (``tasks.run.leases``): the claim, the heartbeat, and whether
another run of the task still runs. The hottest of these statements are written by hand (one per
guarded write): here they are held to what the ORM reads back."""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

from django.utils import timezone

from tasks.models import Run, RunKind, RunState, Task
from tasks.run import heartbeats as beats
from tasks.run import leases as runs
from tests.conftest import Box, queue_through_the_cluster, wait_for
from tests.factories import flow


def queued_run(box: Box, settings: Any) -> Run:
    queue_through_the_cluster(settings)
    task = box.create(title="leased", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    return Run.objects.get(task_id=task["id"])


def test_a_heartbeat_extends_the_lease_of_the_run_that_holds_it_and_no_other(box: Box, settings: Any) -> None:
    claimed = runs.claim(queued_run(box, settings).pk)
    assert claimed is not None
    run, token = claimed
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=5))
    before = timezone.now()
    assert runs.heartbeat(run.pk, token)
    run.refresh_from_db()
    assert run.heartbeat_at is not None and before <= run.heartbeat_at <= timezone.now()
    assert run.lease_expires_at == run.heartbeat_at + runs.lease_delta()
    assert not runs.heartbeat(run.pk, "not-the-token")
    assert runs.finish(run.pk, token, "done")
    assert not runs.heartbeat(run.pk, token)  # a finished run holds no lease


def _claimed(box: Box, settings: Any) -> tuple[Run, str]:
    claimed = runs.claim(queued_run(box, settings).pk)
    assert claimed is not None
    return claimed


def _beaten(run: Run) -> Any:
    return Run.objects.get(pk=run.pk).heartbeat_at


def test_the_processs_heartbeat_thread_beats_for_a_run_until_it_is_forgotten(box: Box, settings: Any) -> None:
    settings.BOX_HEARTBEAT_SECONDS = 0.05
    first, first_token = _claimed(box, settings)
    claimed_at = _beaten(first)
    beat = beats.heartbeats.watch(first.pk, first_token, threading.Event())
    wait_for(lambda: _beaten(first) > claimed_at, what="the first run's lease to be extended")
    beats.heartbeats.forget(beat)
    second, second_token = _claimed(box, settings)
    second_claimed_at = _beaten(second)
    later = beats.heartbeats.watch(second.pk, second_token, threading.Event())
    try:
        # The thread beats one run after another: once the second is beaten, no beat for the first is under way.
        wait_for(lambda: _beaten(second) > second_claimed_at, what="the second run's lease to be extended")
        forgotten_at, once = _beaten(first), _beaten(second)
        wait_for(lambda: _beaten(second) > once, what="another beat of the second run")
        assert _beaten(first) == forgotten_at
    finally:
        beats.heartbeats.forget(later)
    names = [thread.name for thread in threading.enumerate()]
    assert names.count("box-heartbeats") == 1 and not [name for name in names if name.startswith("heartbeat-run-")], names


def test_a_run_whose_lease_is_gone_is_told_to_stop_and_is_not_beaten_again(box: Box, settings: Any) -> None:
    settings.BOX_HEARTBEAT_SECONDS = 0.05
    run, token = _claimed(box, settings)
    stop = threading.Event()
    beat = beats.heartbeats.watch(run.pk, token, stop)
    try:
        Run.objects.filter(pk=run.pk).update(lease_token="taken-over")
        assert stop.wait(20)
        Run.objects.filter(pk=run.pk).update(lease_token=token)  # a beat for it would match again
        stopped_at = _beaten(run)
        other, other_token = _claimed(box, settings)
        other_at = _beaten(other)
        watched = beats.heartbeats.watch(other.pk, other_token, threading.Event())
        wait_for(lambda: _beaten(other) > other_at, what="the other run's lease to be extended")
        once = _beaten(other)
        wait_for(lambda: _beaten(other) > once, what="another beat of the other run")
        beats.heartbeats.forget(watched)
        assert _beaten(run) == stopped_at
    finally:
        beats.heartbeats.forget(beat)


def test_a_runs_close_writes_its_outcome_only_while_it_holds_its_lease(box: Box, settings: Any) -> None:
    claimed = runs.claim(queued_run(box, settings).pk)
    assert claimed is not None
    run, token = claimed
    assert not runs.finish(run.pk, "not-the-token", "done")
    before = timezone.now()
    assert runs.finish(run.pk, token, "waiting:input", "e" * 6000, charged=False)
    run.refresh_from_db()
    assert (run.state, run.outcome, run.error, run.charged, run.lease_token) == ("finished", "waiting:input", "e" * 5000, False, token)
    assert run.finished_at is not None and before <= run.finished_at <= timezone.now()
    assert not runs.finish(run.pk, token, "done")  # a finished run holds no lease


def test_a_final_moves_close_cancels_the_tasks_queued_and_running_runs_only(box: Box, settings: Any) -> None:
    first = queued_run(box, settings)
    task = Task.objects.get(pk=first.task_id)
    claimed = runs.claim(first.pk)
    assert claimed is not None
    ended = runs.create_run(task, RunKind.RESUME)
    assert runs.claim(ended.pk) is not None and runs.finish(ended.pk, Run.objects.get(pk=ended.pk).lease_token, "done")
    waiting = runs.create_run(task, RunKind.RESUME)
    other = queued_run(box, settings)
    before = timezone.now()
    runs.cancel_open_runs(task)
    found = {run.pk: run for run in Run.objects.all()}
    for closed in (found[first.pk], found[waiting.pk]):
        assert (closed.state, closed.outcome, closed.lease_token) == ("cancelled", "cancelled", "")
        assert closed.finished_at is not None and before <= closed.finished_at <= timezone.now()
    assert (found[ended.pk].state, found[ended.pk].outcome) == ("finished", "done")
    assert found[other.pk].state == "queued"  # another task's


def test_a_claim_says_whether_another_run_of_the_task_is_running(box: Box, settings: Any) -> None:
    first = queued_run(box, settings)
    claimed = runs.claim(first.pk)
    assert claimed is not None and claimed[0].others_running is False  # type: ignore[attr-defined]
    assert runs.claim(first.pk) is None  # a second delivery
    second = runs.create_run(Task.objects.get(pk=first.task_id), RunKind.RESUME)
    again = runs.claim(second.pk)
    assert again is not None and again[0].others_running is True  # type: ignore[attr-defined]
    assert again[0].task.pk == first.task_id
    Run.objects.filter(pk=first.pk).update(state=RunState.FINISHED)
    third = runs.create_run(Task.objects.get(pk=first.task_id), RunKind.RESUME)
    Run.objects.filter(pk=second.pk).update(state=RunState.FINISHED)
    last = runs.claim(third.pk)
    assert last is not None and last[0].others_running is False  # type: ignore[attr-defined]


def test_a_claimed_run_and_its_task_are_read_as_the_orm_reads_them(box: Box, settings: Any) -> None:
    claimed = runs.claim(queued_run(box, settings).pk)
    assert claimed is not None
    run, _ = claimed
    read = Run.objects.select_related("task").get(pk=run.pk)
    for made, expected in ((run, read), (run.task, read.task)):
        fields = type(expected)._meta.concrete_fields
        assert {f.attname: getattr(made, f.attname) for f in fields} == {f.attname: getattr(expected, f.attname) for f in fields}
        assert not made._state.adding and made._state.db == expected._state.db
    assert run.task.spent == read.task.spent and isinstance(run.task.spent, dict)


def test_the_heartbeat_thread_goes_on_past_a_fault_of_its_own(box: Box, settings: Any, monkeypatch: Any) -> None:
    """One thread beats for every run of the process: a fault outside the heartbeat's statement
    (closing a broken connection, say) must not end it, or every later run of the worker would
    go unbeaten and be reaped as lost."""
    settings.BOX_HEARTBEAT_SECONDS = 0.05
    due = beats.Heartbeats._due
    faults = []

    def faulty(self: Any) -> Any:
        if not faults:
            faults.append(1)
            raise OSError("the connection's close failed")
        return due(self)

    monkeypatch.setattr(beats.Heartbeats, "_due", faulty)
    run, token = _claimed(box, settings)
    beat = beats.heartbeats.watch(run.pk, token, threading.Event())
    try:
        wait_for(lambda: bool(faults), what="the fault")
        after = _beaten(run)
        wait_for(lambda: _beaten(run) > after, what="a beat after the fault")
    finally:
        beats.heartbeats.forget(beat)

"""The reaper and hand-backs: a run that ends without finishing becomes a retry, or fails its task.

``reap_expired`` runs in the scheduler process; ``hand_back`` in a worker that stops before its
run ends (the box is stopping, or a database fault); ``resume_after_restart`` at the scheduler's
start. All three end the run the same way (``_lose``): under the task's lock, the run becomes
``lost`` (conditional on its lease token), and a ``retry`` run is created with exponential
backoff (``BOX_RETRY_BACKOFF_SECONDS * 2^(attempt-1)``), up to ``BOX_MAX_RUN_ATTEMPTS``; then the
task fails with a clear error, ``recoverable`` and a ``hint``. It sits above ``tasks.services``
(it moves tasks) and ``tasks.run.leases`` (it creates runs); neither imports it.
"""
from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from boxsite.core import procs
from tasks import pauses, services
from tasks.models import EventKind, Run, RunKind, RunState, Task, TaskEvent
from tasks.run import leases as runs
from tasks.run import receipts
from tasks.states import ACTIVE


def backoff_seconds(attempt: int) -> float:
    return float(settings.BOX_RETRY_BACKOFF_SECONDS * (2 ** max(0, attempt - 1)))


@dataclass
class Retry:
    """What becomes of a lost run's task: its next attempt, or a failure past the budget."""

    attempt: int
    delay_s: float
    interrupted: str  # why the step in hand did not finish, for its "interrupted" note
    note: str
    note_data: dict[str, Any] = field(default_factory=dict)
    give_up: str = ""  # the task's error once ``attempt`` is past the budget
    hint: str = "retry the task"
    doing_now: str = ""  # shown as the task's step ("Doing now") while the retry waits


class Lost(NamedTuple):
    """The outcome of ``_lose``: whether the run was closed, and whether its task was still going."""

    closed: bool
    active: bool = False


def _lose(run_id: int, token: str, *, outcome: str, error: str, plan: Callable[[Run], Retry], now: Any = None,
          charged: bool = True) -> Lost:
    """The one way a run ends without finishing. Under the task's lock (the one lock order),
    mark the run lost if it still holds ``token``; then, if its task is still going, fail the
    task once ``plan``'s attempt is past ``BOX_MAX_RUN_ATTEMPTS``, or mark the interrupted step,
    say why in the log and queue the retry run."""
    with transaction.atomic():
        runs.lock_task(Run.objects.values_list("task_id", flat=True).get(pk=run_id))
        closed = Run.objects.filter(pk=run_id, state=RunState.RUNNING, lease_token=token).update(
            state=RunState.LOST, lease_token="", finished_at=now or timezone.now(), outcome=outcome, error=error[:5000],
            charged=charged,  # a stopping box's hand-back is free
        )
        if closed != 1:
            return Lost(False)
        run = Run.objects.select_related("task").get(pk=run_id)
        task = run.task
        pauses.actions().close_in_flight(task, f"its run was lost: {error}", run_id=run.pk)
        if task.state not in ACTIVE:
            return Lost(True)
        retry = plan(run)
        if retry.attempt > settings.BOX_MAX_RUN_ATTEMPTS:
            services.fail_task(task, retry.give_up, recoverable=True, hint=retry.hint)
            return Lost(True, active=True)
        mark_interrupted_step(task, retry.interrupted, run)
        if retry.doing_now:
            Task.objects.filter(pk=task.pk).update(step=retry.doing_now)
        services.note(task, retry.note, retry.note_data)
        runs.create_run(task, RunKind.RETRY, resume=task.resume, delay_s=retry.delay_s, attempt=retry.attempt)
    return Lost(True, active=True)


# How a run was lost, as its ``error`` says: the give-up message counts each (``cut_attempts``).
KILLED = "the worker's process died (killed); its lease expired"
EXPIRED = "the worker stopped heartbeating; its lease expired"
RESTARTED = "the box restarted while this run was working"


def cut_attempts(run: Run) -> str:
    """How the attempts of ``run``'s task since its last first attempt ended without finishing:
    "3 times: 2 killed, 1 cut by a restart of the box, 0 by an expired lease" (and hand-backs
    for a database fault, when there were any)."""
    first = (Run.objects.filter(task_id=run.task_id, attempt=1, number__lte=run.number)
             .order_by("-number").values_list("number", flat=True).first()) or 1
    errors = list(Run.objects.filter(task_id=run.task_id, state=RunState.LOST, charged=True, number__gte=first,
                                     number__lte=run.number).values_list("error", flat=True))
    killed, restarted, expired = errors.count(KILLED), errors.count(RESTARTED), errors.count(EXPIRED)
    faults = len(errors) - killed - restarted - expired
    words = f"{len(errors)} times: {killed} killed, {restarted} cut by a restart of the box, {expired} by an expired lease"
    return words + (f", {faults} handed back after a fault" if faults else "")


def reap_expired(now: Any = None) -> int:
    """Mark runs whose lease expired as lost; retry them or fail their task. Returns how many.
    A run whose worker was on this machine and is gone was killed; one whose worker lives (or
    is elsewhere) stopped heartbeating."""
    now = now or timezone.now()
    max_attempts = settings.BOX_MAX_RUN_ATTEMPTS

    def plan(run: Run) -> Retry:
        delay = backoff_seconds(run.attempt)
        return Retry(
            attempt=run.attempt + 1, delay_s=delay, interrupted="the worker was lost",
            note=f"worker lost (lease expired); retrying in {delay:g}s, attempt {run.attempt + 1} of {max_attempts}",
            note_data={"run": run.number, "attempt": run.attempt + 1},
            give_up=f"the worker was lost {cut_attempts(run)}; gave up after {run.attempt} attempts",
            hint="check the worker logs; retry the task once the cause is fixed",
        )

    host = socket.gethostname()[:255]
    expired = list(
        Run.objects.filter(state=RunState.RUNNING, lease_expires_at__lt=now).values_list("pk", "lease_token", "worker_host", "worker_pid")
    )
    return sum(
        _lose(run_id, token, outcome="lost", plan=plan, now=now,
              error=KILLED if worker_host == host and pid is not None and not procs.alive(pid) else EXPIRED).closed
        for run_id, token, worker_host, pid in expired
    )


def hand_back(run_id: int, token: str, why: str, *, counts_as_attempt: bool = False) -> bool:
    """The worker stops before the run ends: close the run and queue another, which resumes where
    the task saved its progress. A stopping box's hand-back is free; a run that hit a database
    fault counts as an attempt (with backoff) and the task fails once attempts run out. False
    when the run no longer held its lease (the reaper or a cancel has it then)."""
    max_attempts = settings.BOX_MAX_RUN_ATTEMPTS

    def plan(run: Run) -> Retry:
        attempt = run.attempt + 1 if counts_as_attempt else run.attempt
        delay = backoff_seconds(run.attempt) if counts_as_attempt else 0.0
        return Retry(
            attempt=attempt, delay_s=delay, interrupted=why,
            note=f"run {run.number} handed back ({why}); {'retrying' if counts_as_attempt else 'it resumes'}"
                 f"{f' in {delay:g}s' if delay else ''}, attempt {attempt} of {max_attempts}",
            note_data={"run": run.number, "handed_back": True, "attempt": attempt},
            give_up=f"{why}; the worker was lost {cut_attempts(run)}; gave up after {run.attempt} attempts",
            hint="check the database and the box's log; retry the task once it is fixed",
        )

    return _lose(run_id, token, outcome="handed back", error=why, plan=plan, charged=counts_as_attempt).closed


def resume_after_restart(now: Any = None, *, started_before: Any = None) -> int:
    """At start-up: runs this machine was working on whose worker process is gone were cut off by
    a restart of the box. Say so at once ("the box restarted; resuming step N") and queue their
    retry now, instead of showing "running" until the lease expires. A worker pid that is alive
    (reused, or a worker that outlived the restart) is left to its lease. Only runs that started
    before ``started_before`` (this process's start) count: a run the new cluster started while
    this process was still starting, and whose worker then died, was not cut off by the restart;
    the reaper retries it as a lost worker. Returns how many."""
    now = now or timezone.now()
    host = socket.gethostname()[:255]
    rows_query = Run.objects.filter(state=RunState.RUNNING, worker_host=host)
    if started_before is not None:
        rows_query = rows_query.filter(started_at__lt=started_before)
    rows = list(rows_query.values_list("pk", "lease_token", "worker_pid"))

    def plan(run: Run) -> Retry:
        task = run.task
        where = f"resuming step {int((task.resume or {}).get('step', 0)) + 1}" if task.flow else "starting its worker again"
        words = f"the box restarted; {where}"
        return Retry(
            attempt=run.attempt + 1, delay_s=0.0, interrupted="the box restarted", note=words,
            note_data={"restart": True, "run": run.number, "attempt": run.attempt + 1}, doing_now=words,
            give_up=f"the box restarted during attempt {run.attempt} of {run.attempt}; the worker was lost "
                    f"{cut_attempts(run)}; gave up",
        )

    return sum(
        _lose(run_id, token, outcome="lost", error=RESTARTED, plan=plan, now=now).active
        for run_id, token, pid in rows
        if pid is not None and not procs.alive(pid)  # a zombie is gone too: it does no work
    )


def mark_interrupted_step(task: Task, why: str, run: Run | None = None) -> None:
    """Say in the log that the step a lost run was in the middle of did not finish.

    A step that finished saved its resume point past itself, so the last step event names an
    unfinished step exactly when its index is still where the task resumes. The retry runs it
    again from its start, unless ``run`` left the step's receipt (its process had ended): then
    the retry records the step's result from it, and nothing was interrupted."""
    last = TaskEvent.objects.filter(task=task, kind=EventKind.STEP).order_by("-seq").values_list("summary", "data").first()
    if last is None:
        return
    summary, data = last
    # Step events number steps from 1 (as their summaries do); the resume point is the 0-based index.
    if not isinstance(data, dict) or data.get("step") != int((task.resume or {}).get("step", 0)) + 1:
        return
    if run is not None and receipts.finished_in(task.pk, data["step"] - 1, run):
        return
    services.note(task, f"interrupted: {summary} ({why}); it runs again from its start",
                  {"interrupted": True, "step": data.get("step")})

"""Runs and leases: claiming, heartbeats, finishing, and the reaper.

A run is claimed by a conditional update that sets a fresh lease token. Every write a worker
makes checks that token (see ``tasks.recorder``), so a worker whose lease was taken over cannot
write. The reaper (in the scheduler process) turns expired leases into retries with exponential
backoff, and fails the task when attempts run out.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from tasks.models import EventKind, Run, RunKind, RunState, Task, TaskEvent
from tasks.states import ACTIVE

log = logging.getLogger(__name__)


def lock_task(task_id: str) -> None:
    """Lock the task's row for the rest of the transaction. Every transaction that writes a task
    and its runs takes the task row first (see ``services.transition``), so two of them wait for
    each other instead of deadlocking. (SQLite's write transactions are serial anyway.)"""
    list(Task.objects.select_for_update().filter(pk=task_id).values_list("pk", flat=True))


def lease_delta() -> timedelta:
    return timedelta(seconds=settings.BOX_LEASE_SECONDS)


def create_run(task: Task, kind: str, *, resume: dict[str, Any] | None = None, delay_s: float = 0.0, attempt: int = 1) -> Run:
    """Create a queued run. Call inside the transaction that decided it; it is enqueued after commit."""
    number = (Run.objects.filter(task=task).aggregate(n=Max("number"))["n"] or 0) + 1
    now = timezone.now()
    run = Run.objects.create(
        task=task, number=number, kind=kind, attempt=attempt, resume=resume or {},
        available_at=now + timedelta(seconds=delay_s),
    )
    if delay_s <= 0:
        transaction.on_commit(lambda: enqueue(run.pk))
    return run


def enqueue(run_id: int) -> None:
    Run.objects.filter(pk=run_id, state=RunState.QUEUED).update(enqueued_at=timezone.now())
    if settings.BOX_RUN_INLINE:
        from tasks.jobs import execute_run

        execute_run(run_id)
        return
    from django_q.tasks import async_task

    async_task("tasks.jobs.execute_run", run_id, task_name=f"run-{run_id}")


def claim(run_id: int) -> tuple[Run, str] | None:
    """Take the run if nobody has. A second delivery of the same run finds it taken: None."""
    token = secrets.token_hex(16)
    now = timezone.now()
    taken = Run.objects.filter(pk=run_id, state=RunState.QUEUED).update(
        state=RunState.RUNNING,
        lease_token=token,
        lease_expires_at=now + lease_delta(),
        heartbeat_at=now,
        started_at=now,
        worker_host=socket.gethostname()[:255],
        worker_pid=os.getpid(),
    )
    if taken != 1:
        return None
    return Run.objects.select_related("task").get(pk=run_id), token


def heartbeat(run_id: int, token: str) -> bool:
    """Extend the lease. False means the lease is gone (taken over, cancelled, finished)."""
    now = timezone.now()
    return Run.objects.filter(pk=run_id, state=RunState.RUNNING, lease_token=token).update(
        heartbeat_at=now, lease_expires_at=now + lease_delta()
    ) == 1


def holds_lease(run_id: int, token: str) -> bool:
    """Check and extend the lease; call inside the transaction of the write it guards."""
    return heartbeat(run_id, token)


def finish(run_id: int, token: str, outcome: str, error: str = "") -> bool:
    return Run.objects.filter(pk=run_id, state=RunState.RUNNING, lease_token=token).update(
        state=RunState.FINISHED, outcome=outcome, error=error[:5000], finished_at=timezone.now()
    ) == 1


def cancel_open_runs(task: Task) -> None:
    """Close every queued or running run of a task that reached a final state (same transaction)."""
    Run.objects.filter(task=task, state__in=[RunState.QUEUED, RunState.RUNNING]).update(
        state=RunState.CANCELLED, lease_token="", finished_at=timezone.now(), outcome="cancelled"
    )


def backoff_seconds(attempt: int) -> float:
    return float(settings.BOX_RETRY_BACKOFF_SECONDS * (2 ** max(0, attempt - 1)))


def reap_expired(now: Any = None) -> int:
    """Mark runs whose lease expired as lost; retry them or fail their task. Returns how many."""
    from tasks import services

    now = now or timezone.now()
    reaped = 0
    expired = list(
        Run.objects.filter(state=RunState.RUNNING, lease_expires_at__lt=now).values_list("pk", "lease_token")
    )
    for run_id, token in expired:
        with transaction.atomic():
            lock_task(Run.objects.values_list("task_id", flat=True).get(pk=run_id))
            lost = Run.objects.filter(pk=run_id, state=RunState.RUNNING, lease_token=token).update(
                state=RunState.LOST, lease_token="", finished_at=now, outcome="lost",
                error="the worker stopped heartbeating; its lease expired",
            )
            if lost != 1:
                continue
            reaped += 1
            run = Run.objects.select_related("task").get(pk=run_id)
            task = run.task
            if task.state not in ACTIVE:
                continue
            if run.attempt >= settings.BOX_MAX_RUN_ATTEMPTS:
                services.fail_task(
                    task,
                    f"the worker was lost {run.attempt} times (its lease expired each time); gave up after {run.attempt} attempts",
                    recoverable=True,
                    hint="check the worker logs; continue or start the task again once the cause is fixed",
                )
                continue
            mark_interrupted_step(task, "the worker was lost")
            delay = backoff_seconds(run.attempt)
            services.note(task, f"worker lost (lease expired); retrying in {delay:g}s, attempt {run.attempt + 1} of {settings.BOX_MAX_RUN_ATTEMPTS}",
                          {"run": run.number, "attempt": run.attempt + 1})
            create_run(task, RunKind.RETRY, resume=task.resume, delay_s=delay, attempt=run.attempt + 1)
    return reaped


def hand_back(run_id: int, token: str, why: str, *, counts_as_attempt: bool = False) -> bool:
    """The worker stops before the run ends: close the run and queue another, which resumes where
    the task saved its progress. A stopping box's hand-back is free; a run that hit a database
    fault counts as an attempt (with backoff) and the task fails once attempts run out. False
    when the run no longer held its lease (the reaper or a cancel has it then)."""
    from tasks import services  # reason: services imports this module

    with transaction.atomic():
        lock_task(Run.objects.values_list("task_id", flat=True).get(pk=run_id))
        run = Run.objects.select_related("task").get(pk=run_id)
        task = run.task
        closed = Run.objects.filter(pk=run_id, state=RunState.RUNNING, lease_token=token).update(
            state=RunState.LOST, lease_token="", finished_at=timezone.now(), outcome="handed back", error=why[:5000],
        )
        if closed != 1:
            return False
        if task.state not in ACTIVE:
            return True
        mark_interrupted_step(task, why)
        attempt = run.attempt + 1 if counts_as_attempt else run.attempt
        if attempt > settings.BOX_MAX_RUN_ATTEMPTS:
            services.fail_task(task, f"{why}; gave up after {run.attempt} attempts", recoverable=True,
                               hint="check the database and the box's log; continue the task once it is fixed")
            return True
        delay = backoff_seconds(run.attempt) if counts_as_attempt else 0.0
        services.note(task, f"run {run.number} handed back ({why}); {'retrying' if counts_as_attempt else 'it resumes'}"
                            f"{f' in {delay:g}s' if delay else ''}, attempt {attempt} of {settings.BOX_MAX_RUN_ATTEMPTS}",
                      {"run": run.number, "handed_back": True, "attempt": attempt})
        create_run(task, RunKind.RETRY, resume=task.resume, delay_s=delay, attempt=attempt)
    return True


def resume_after_restart(now: Any = None) -> int:
    """At start-up: runs this machine was working on whose worker process is gone were cut off by
    a restart of the box. Say so at once ("the box restarted; resuming step N") and queue their
    retry now, instead of showing "running" until the lease expires. A worker pid that is alive
    (reused, or a worker that outlived the restart) is left to its lease. Returns how many."""
    from tasks import services  # reason: services imports this module

    now = now or timezone.now()
    host = socket.gethostname()[:255]
    resumed = 0
    rows = list(Run.objects.filter(state=RunState.RUNNING, worker_host=host).values_list("pk", "lease_token", "worker_pid"))
    for run_id, token, pid in rows:
        if pid is None or _process_alive(pid):
            continue
        with transaction.atomic():
            lock_task(Run.objects.values_list("task_id", flat=True).get(pk=run_id))
            lost = Run.objects.filter(pk=run_id, state=RunState.RUNNING, lease_token=token).update(
                state=RunState.LOST, lease_token="", finished_at=now, outcome="lost",
                error="the box restarted while this run was working",
            )
            if lost != 1:
                continue
            run = Run.objects.select_related("task").get(pk=run_id)
            task = run.task
            if task.state not in ACTIVE:
                continue
            resumed += 1
            if run.attempt >= settings.BOX_MAX_RUN_ATTEMPTS:
                services.fail_task(task, f"the box restarted during attempt {run.attempt} of {run.attempt}; gave up",
                                   recoverable=True, hint="continue or start the task again")
                continue
            mark_interrupted_step(task, "the box restarted")
            where = f"resuming step {int((task.resume or {}).get('step', 0)) + 1}" if task.flow else "starting its worker again"
            words = f"the box restarted; {where}"
            Task.objects.filter(pk=task.pk).update(step=words)
            services.note(task, words, {"restart": True, "run": run.number, "attempt": run.attempt + 1})
            create_run(task, RunKind.RETRY, resume=task.resume, attempt=run.attempt + 1)
    return resumed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_interrupted_step(task: Task, why: str) -> None:
    """Say in the log that the step a lost run was in the middle of did not finish.

    A step that finished saved its resume point past itself, so the last step event names an
    unfinished step exactly when its index is still where the task resumes. The retry runs it
    again from its start."""
    from tasks import services  # reason: services imports this module

    last = TaskEvent.objects.filter(task=task, kind=EventKind.STEP).order_by("-seq").values_list("summary", "data").first()
    if last is None:
        return
    summary, data = last
    # Step events number steps from 1 (as their summaries do); the resume point is the 0-based index.
    if not isinstance(data, dict) or data.get("step") != int((task.resume or {}).get("step", 0)) + 1:
        return
    services.note(task, f"interrupted: {summary} ({why}); it runs again from its start",
                  {"interrupted": True, "step": data.get("step")})


def dispatch_due(now: Any = None) -> int:
    """Enqueue runs whose backoff is over, and re-send runs the queue seems to have lost."""
    now = now or timezone.now()
    due = list(Run.objects.filter(state=RunState.QUEUED, enqueued_at__isnull=True, available_at__lte=now).values_list("pk", flat=True))
    due += stranded_runs(now)
    for run_id in due:
        enqueue(run_id)
    return len(due)


def free_workers() -> int:
    return int(settings.Q_CLUSTER["workers"]) - Run.objects.filter(state=RunState.RUNNING).count()  # type: ignore[call-overload]


def stranded_runs(now: Any) -> list[int]:
    """Queued runs sent more than ``BOX_RESEND_S`` ago while a worker is free to take them.

    A queue message can die with a cluster (prefetched, or locked by a reader that is gone).
    Re-sending is safe because a second delivery of a claimed run does nothing; waiting for a
    free worker keeps a busy box from piling copies into its queue."""
    if free_workers() <= 0:
        return []
    before = now - timedelta(seconds=settings.BOX_RESEND_S)
    return list(Run.objects.filter(state=RunState.QUEUED, enqueued_at__lt=before).values_list("pk", flat=True))


def cluster_stuck(now: Any = None) -> bool:
    """Runs wait while the cluster claims nothing: a worker is free, a sent run has been waiting
    longer than ``BOX_STUCK_S``, and no run was claimed in that time. The supervisor restarts
    the cluster then (a killed django-q2 worker can leave its queue locked for good)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.BOX_STUCK_S)
    if free_workers() <= 0:
        return False
    if not Run.objects.filter(state=RunState.QUEUED, enqueued_at__isnull=False, available_at__lt=since).exists():
        return False
    return not Run.objects.filter(started_at__gte=since).exists()


def resend_unclaimed() -> int:
    """At start-up (of the scheduler, or of a restarted cluster): send every run that was sent
    and never claimed again; the queue they were in may have died with the old cluster."""
    unclaimed = list(Run.objects.filter(state=RunState.QUEUED, enqueued_at__isnull=False).values_list("pk", flat=True))
    for run_id in unclaimed:
        enqueue(run_id)
    if unclaimed:
        log.info("re-sent %d queued run(s) the queue may have lost", len(unclaimed))
    return len(unclaimed)


def active_run(task: Task) -> Run | None:
    return Run.objects.filter(task=task, state__in=[RunState.QUEUED, RunState.RUNNING]).order_by("-number").first()

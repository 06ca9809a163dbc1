"""Runs and leases: claiming, heartbeats, finishing, and dispatching due runs.

A run is claimed by a conditional update that sets a fresh lease token. Every write a worker
makes checks that token (see ``tasks.run.recorder``), so a worker whose lease was taken over cannot
write. Runs that end without finishing (an expired lease, a hand-back) are ``tasks.run.reaper``'s.
"""
from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import ForeignKey, Max
from django.utils import timezone
from django_q.brokers import Broker, get_broker
from django_q.conf import Conf
from django_q.tasks import async_task

from tasks import sql
from tasks.machines import homes
from tasks.models import Run, RunState, Task

if TYPE_CHECKING:
    from tasks.run.handover import Handover

log = logging.getLogger(__name__)

_kept: dict[tuple[str, int], Broker] = {}  # ``_broker``'s, by the queue's name and the process
_kept_lock = threading.Lock()


def _forget_kept_broker() -> None:
    """In a forked child: the parent's broker is keyed by the parent's pid, and a thread of the
    parent may have held the lock at the fork (the child would wait for it for good)."""
    global _kept, _kept_lock
    _kept, _kept_lock = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_kept_broker)


def lock_task(task_id: str) -> None:
    """Lock the task's row for the rest of the transaction. Every transaction that writes a task
    and its runs takes the task row first (see ``services.transition``), so two of them wait for
    each other instead of deadlocking. SQLite has no row locks: the box opens its transactions
    there with BEGIN IMMEDIATE, which already holds the one write lock, so nothing is read."""
    if not connection.features.has_select_for_update:
        return
    list(Task.objects.select_for_update().filter(pk=task_id).values_list("pk", flat=True))


def read_locked(task: Task) -> None:
    """Read ``task`` again in full, its row locked for the rest of the transaction (``lock_task``),
    by a statement written once (``sql.locked_task``).
    As ``refresh_from_db`` with ``select_for_update``, except that a related row cached for the
    same key is kept (the run's workspace, read with its claim); reverse one-to-one rows (its
    layer) and prefetched rows are dropped, as there."""
    stored = sql.locked_task(task.pk)
    if stored is None:
        raise Task.DoesNotExist(f"no task '{task.pk}'")
    for field in Task._meta.concrete_fields:
        value = getattr(stored, field.attname)
        if isinstance(field, ForeignKey) and field.is_cached(task) and getattr(task, field.attname) != value:
            field.delete_cached_value(task)  # as refresh_from_db: a related row cached for another key goes
        setattr(task, field.attname, value)
    for related in Task._meta.related_objects:
        if related.one_to_one and related.is_cached(task):
            related.delete_cached_value(task)
    task.__dict__.pop("_prefetched_objects_cache", None)
    task._state.adding, task._state.db = False, stored._state.db


def lock_task_of_queued(run_id: int) -> str | None:
    """The task of run ``run_id`` while the run is queued (else None), its row locked for the rest
    of the transaction (``lock_task``), in one statement."""
    return sql.task_of_queued_run(run_id)


def lease_delta() -> timedelta:
    return timedelta(seconds=settings.BOX_LEASE_SECONDS)


def create_run(task: Task, kind: str, *, resume: dict[str, Any] | None = None, delay_s: float = 0.0, attempt: int = 1,
               first: bool = False, handover: Handover | None = None) -> Run:
    """Create a queued run. Call inside the transaction that decided it; it is sent to the queue
    after commit. A run due now is written as sent (``enqueued_at``) in that transaction: if the
    process dies between the commit and the send, the scheduler sends it again after
    ``BOX_RESEND_S`` (``stranded_runs``), as it does for a message the queue lost. ``first``:
    the task was inserted in this transaction, so it has no run yet (its number is 1, not asked).
    ``handover``: inside a finish, the run due now is the finish's to hold or send (``send_after_commit``)."""
    number = 1 if first else (Run.objects.filter(task=task).aggregate(n=Max("number"))["n"] or 0) + 1
    now = timezone.now()
    run = Run.objects.create(
        task=task, number=number, kind=kind, attempt=attempt, resume=resume or {},
        available_at=now + timedelta(seconds=delay_s), enqueued_at=now if delay_s <= 0 else None,
    )
    if delay_s <= 0:
        send_after_commit(run.pk, handover)
    return run


def send_after_commit(run_id: int, handover: Handover | None = None) -> None:
    """Run ``run_id``, created due now in this transaction, is sent once it commits; given a
    finish's ``handover``, that notes it and sends it or holds it back (``Handover.committed``)."""
    if handover is not None:
        handover.send_after_commit(run_id)
        return
    transaction.on_commit(functools.partial(send, run_id))


def enqueue(run_id: int) -> None:
    """Mark a queued run sent, then send it (a run that came due, or one sent again)."""
    Run.objects.filter(pk=run_id, state=RunState.QUEUED).update(enqueued_at=timezone.now())
    send(run_id)


def send(run_id: int) -> None:
    """Put run ``run_id`` on the queue (``tasks.jobs.execute_run``): with several machines, on
    the queue of the machine that holds its workspace; not at all while the workspace moves (the
    move sends it once done)."""
    queue = None
    if settings.BOX_MACHINE:
        home = homes.home_of_run(run_id)
        if home is None or home.moving:
            return
        queue = homes.queue_of(home.machine)
    async_task("tasks.jobs.execute_run", run_id, task_name=f"run-{run_id}", broker=_broker(queue))


def _broker(queue: str | None = None) -> Broker:
    """The queue's broker, one per process and queue name. django-q2 makes a broker for each job
    it is given unless one is passed: on Redis a new client, so a new connection (its driver's
    version looked up in the installed packages, a connect and a handshake) for every job sent,
    a large share of a task's creation (docs/internals/decisions-performance.md#performance). redis-py's
    client is shared by threads and makes its connections again in a forked child; the ORM
    broker holds no connection of its own."""
    key = (queue or Conf.CLUSTER_NAME, os.getpid())
    with _kept_lock:
        if key not in _kept:
            _kept[key] = get_broker(queue)
        return _kept[key]


def claim(run_id: int) -> tuple[Run, str] | None:
    """Take the run if nobody has. A second delivery of the same run finds it taken: None.
    The run comes with its task, and ``others_running``: whether another run of the task is
    running (a held one, ``tasks.run.finish``). Call inside the transaction that locked the task's
    row (``lock_task_of_queued``): other runs of the task change only under it."""
    if settings.BOX_MACHINE:
        # Several machines: a run of a workspace another machine holds (sent before it moved, or
        # held by this worker's finish) is not taken here; it is sent where it belongs.
        home = homes.home_of_run(run_id)
        if home is None or not home.is_here:
            if home is not None and not home.moving:
                transaction.on_commit(functools.partial(send, run_id))
            return None
    token = secrets.token_hex(16)
    now = timezone.now()
    claimed = sql.claim_run(run_id, token, now, now + lease_delta(), socket.gethostname()[:255], os.getpid())
    if claimed is None:
        return None
    run = claimed.run
    run.others_running = claimed.others_running  # type: ignore[attr-defined]
    return run, token


def heartbeat(run_id: int, token: str) -> bool:
    """Extend the lease. False means the lease is gone (taken over, cancelled, finished).

    Every guarded write of a run proves its lease with this (``holds_lease``)."""
    now = timezone.now()
    return sql.extend_lease(run_id, token, now, now + lease_delta())


def holds_lease(run_id: int, token: str) -> bool:
    """Check and extend the lease; call inside the transaction of the write it guards."""
    return heartbeat(run_id, token)


def lease_lasts(run_id: int, token: str, seconds: float) -> bool:
    """The run holds its lease for at least ``seconds`` more, as last committed: a read, which
    neither extends the lease nor waits for a transaction that holds the run's row."""
    return sql.lease_lasts(run_id, token, timezone.now() + timedelta(seconds=seconds))


def finish(run_id: int, token: str, outcome: str, error: str = "", *, charged: bool = True) -> bool:
    """Close the run with its outcome; ``charged=False`` refunds the attempt (a wait for the owner).
    False when the run no longer holds its lease (nothing was written): the update is conditional
    on the run's state and token, as the lease's heartbeat is, so it proves the lease as well
    (``finalize.finish_run``)."""
    return sql.finish_run(run_id, token, outcome, error[:5000], timezone.now(), charged)


def cancel_open_runs(task: Task) -> None:
    """Close every queued or running run of a task that reached a final state (same transaction)."""
    sql.cancel_open_runs(task.pk, timezone.now())


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
    """Queued runs the queue seems to have lost, while a worker is free to take them: sent more
    than ``BOX_RESEND_S`` ago, and either overtaken (a run sent after it was claimed since then:
    the queue hands runs out in the order they were sent) or no run at all was claimed in that
    time (the queue died with its cluster).

    A queue message can die with a cluster (prefetched, or locked by a reader that is gone).
    Re-sending is safe because a second delivery of a claimed run does nothing; a run merely
    waiting its turn behind a busy queue is not sent again, nor while no worker is free: copies
    would pile up in the queue (docs/internals/decisions.md#the-workers-path). A dependent's run
    its dependency's worker took at once (``tasks.run.handover``) overtakes the queue too: a run
    waiting then is sent again, and its claim runs it once."""
    if free_workers() <= 0:
        return []
    before = now - timedelta(seconds=settings.BOX_RESEND_S)
    waiting = list(Run.objects.filter(state=RunState.QUEUED, enqueued_at__lt=before).values_list("pk", "enqueued_at"))
    if not waiting:
        return []
    last_claimed = Run.objects.filter(started_at__gte=before).aggregate(sent=Max("enqueued_at"))["sent"]
    return [run_id for run_id, sent in waiting if last_claimed is None or sent < last_claimed]


def cluster_stuck(now: Any = None, *, for_s: float | None = None) -> bool:
    """Runs wait while the cluster claims nothing: a worker is free, a sent run has been waiting
    longer than ``for_s`` (``BOX_STUCK_S``), and no run was claimed in that time. The cluster
    leader restarts its cluster then (a killed django-q2 worker can leave its queue locked for
    good); the supervisor restarts the leader after three times as long."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.BOX_STUCK_S if for_s is None else for_s)
    if free_workers() <= 0:
        return False
    # Several machines: only the runs this machine takes say whether its cluster is stuck.
    mine = Run.objects.filter(homes.runs_here_q()) if settings.BOX_MACHINE else Run.objects.all()
    if not mine.filter(state=RunState.QUEUED, enqueued_at__isnull=False, available_at__lt=since).exists():
        return False
    return not mine.filter(started_at__gte=since).exists()


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

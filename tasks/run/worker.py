"""The worker's path: a run from the queue to its finish, and on along its chain.

``execute_run`` (the queue's job, ``tasks.jobs``) reads top-down, and so does this module:

1. **claim** the run and move its task to running, one transaction (``finish.begin_run``);
2. **run** its worker in the run's view, its lease extended by the process's heartbeat thread
   (``tasks.run.heartbeats``) and its broker open to the task's processes;
3. **finish**: apply the outcome in one transaction that proves the lease
   (``finish.finish_run``), a done task's layer sealed beside it (``tasks.layers.sealer``);
4. **chain**: a run that finish made due (a dependent that waited on this task) is held back
   from the queue and taken next by this worker, claimed with the finish; or sent, when this
   worker does not go on.

What each step leaves for the next is returned: ``Begun`` (the claim), ``Ran`` (the outcome and
what it cost), ``Next`` (the run held for this worker, its claim, the releases kept until its
view is open).
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import NamedTuple

from django.conf import settings
from django.db import close_old_connections, connection

from tasks.broker.server import serving as broker_serving
from tasks.layers import sealer
from tasks.models import Task
from tasks.run import leases as runs
from tasks.run import lifecycle, reaper
from tasks.run.context import RunContext
from tasks.run.finish import Begun, Finished, begin_run, finish_run
from tasks.run.heartbeats import heartbeats
from tasks.run.recorder import (
    TRANSIENT_DB_ERRORS,
    LeaseLost,
    LimitReached,
    StepRecorder,
    first_line,
    retried_within_lease,
)
from tasks.sandbox import resident
from tasks.states import FINAL
from tasks.vault.facts import Facts
from tasks.workers import worker_for
from tasks.workers.base import Done, Failed, Outcome
from tasks.workers.shaping import SHAPE_RESUME, shape_output

log = logging.getLogger(__name__)


# Set in a worker process when its cluster stops: the run in hand is stopped and handed back.
handing_back = threading.Event()
_current_stop: threading.Event | None = None


def hand_back_on_signal(signum: int, frame: object) -> None:
    """SIGUSR1 from the cluster leader (``runcluster``) as it stops: no new claims, and the run
    in hand stops its step and is handed back to resume at the next start."""
    handing_back.set()
    if _current_stop is not None:
        _current_stop.set()


class Ran(NamedTuple):
    """What a run's work leaves for its finish: the outcome, the recorder its writes went
    through, and the running time it used (less the time it waited for the owner)."""

    outcome: Outcome
    recorder: StepRecorder
    elapsed_ms: int


class Next(NamedTuple):
    """What a run's finish leaves for the worker: the run it held back for this worker (None:
    the chain ends here), the releases it asked for, kept until that run's view is open, and
    that run's claim when the finish made it."""

    held: int | None
    releases: lifecycle.Held
    claimed: Begun | None


def _end() -> Next:
    return Next(None, [], None)


def execute_run(run_id: int) -> None:
    """Claim run ``run_id`` and execute it. A second delivery finds it claimed and returns.

    A run whose finish started another task's run (a dependent that was waiting on it) goes on
    with that run in the same worker, so a chain of tasks does not wait for the queue at each
    link. That run is held back from the queue (``finish_run``'s ``hand_over``): the other worker
    is not woken only to find it taken. When this worker goes on with it, the finish that started
    it claims it too, in the same transaction (``finish_run``'s ``claim_next``); it is sent instead
    when this worker does not take it (the cluster is stopping, or this job is past a tenth of
    django-q2's job timeout, so a run taken this way has nearly a job's time of its own). If the
    process dies holding it unclaimed, the scheduler sends it again (it was written as sent);
    claimed, the reaper takes it back once its lease is gone, as any claimed run's; the claim runs
    each run once either way.
    """
    began = time.monotonic()
    budget = settings.BOX_JOB_TIMEOUT_S / 10

    def goes_on() -> bool:
        return not handing_back.is_set() and time.monotonic() - began < budget

    link = _execute(run_id, [], goes_on)
    while (held := link.held) is not None:
        releases, claimed = link.releases, link.claimed
        if claimed is None and not goes_on():
            lifecycle.submit_held(releases)
            _send(held)
            return
        try:
            link = _execute(held, releases, goes_on, claimed)
        except BaseException as exc:
            lifecycle.submit_held(releases)  # the run before's: a no-op once ``_execute`` handed them over
            if claimed is not None and isinstance(exc, Exception):
                # Claimed with the finish before: handed back, so it resumes at once (a hand-back
                # of a run that went further finds it closed, or gone from its lease, and is a no-op).
                _hand_back(held, claimed.token, f"its worker's job broke ({type(exc).__name__})", counts_as_attempt=False)
            else:
                # Perhaps claimed already (by ``_execute``, or with the finish before by a process
                # that is exiting): then that delivery finds it taken, and the reaper takes the
                # run back once its lease is gone.
                _send(held)
            raise


def _execute(run_id: int, before: lifecycle.Held, goes_on: Callable[[], bool], claimed: Begun | None = None) -> Next:
    """One link of the chain: claim run ``run_id`` (unless ``claimed``: the finish before claimed
    it), run it and finish it. ``before``: the releases the run before's finish asked for, handed
    to the janitor once this run's view is open, or when it goes no further. ``goes_on``: whether
    this worker goes on with the next run, asked at the finish, which then claims it too."""
    try:
        started = time.monotonic()
        begun = claimed if claimed is not None else _claim(run_id)
        # A run claimed with the finish before goes on as one claimed here would: a stop that came
        # since is set on it in ``_run``, so its step stops and the run is handed back.
        if begun is None or not begun.go or begun.redactor is None:
            return _end()  # taken or closed; or the task had ended, or another run holds it: the run was closed
        ran = _run(begun, before, started)
        if ran is None:
            return _end()  # handed back, or its lease was lost: nothing to finish
        return _finish(begun, ran, goes_on)
    finally:
        lifecycle.submit_held(before)  # emptied once handed over: a no-op after the view's opening


# --- claim ------------------------------------------------------------------------------------

def _claim(run_id: int) -> Begun | None:
    """``begin_run`` for a delivery of the queue; None when there is nothing to run."""
    if handing_back.is_set():
        return None  # the cluster is stopping: the run stays queued and is sent again at start-up
    close_old_connections()
    _skip_the_health_check()
    try:
        begun = begin_run(run_id)  # claimed, and the task running: one transaction
    except TRANSIENT_DB_ERRORS as exc:
        log.warning("run %s could not be claimed (a database fault: %s); the scheduler sends it again", run_id, first_line(exc))
        return None
    if begun is None:
        log.info("run %s is already taken or closed; nothing to do", run_id)
    return begun


def _skip_the_health_check() -> None:
    """The job's first statement goes without the health check's ``SELECT 1`` (a round trip before
    every job, ``CONN_HEALTH_CHECKS``): the claim is that statement, and ``begin_run`` tries its
    transaction again on a fresh connection when the kept one turns out dead."""
    if connection.connection is not None:
        connection.health_check_done = True  # type: ignore[attr-defined]  # the check's own flag (BaseDatabaseWrapper)


# --- run --------------------------------------------------------------------------------------

def _run(begun: Begun, before: lifecycle.Held, started: float) -> Ran | None:
    """Run the task's worker in the run's view, its lease beaten meanwhile; None when the run
    was handed back or lost its lease (nothing to finish). ``started``: when the link began,
    for the running time it used."""
    global _current_stop
    run, token = begun.run, begun.token
    assert begun.redactor is not None
    task = run.task
    recorder = StepRecorder(task, run.pk, token, begun.redactor)
    stop = _current_stop = threading.Event()
    if handing_back.is_set():
        stop.set()
    heartbeat = heartbeats.watch(run.pk, token, stop)
    outcome: Outcome
    ctx: RunContext | None = None
    try:
        remaining = task.limit("max_elapsed_ms")
        deadline = None if remaining is None else started + max(0, remaining - task.spent.get("elapsed_ms", 0)) / 1000
        workdir = lifecycle.prepare(task)
        lifecycle.submit_held(before)  # the run before's release, now that its layer is this view's
        ctx = RunContext(task=task, run=run, workdir=workdir, facts=Facts.of(task).with_vault(task.vault_secrets or []), recorder=recorder, deadline=deadline,
                         stop=stop)
        # The task's processes reach the box through this run's broker, open while the worker works.
        with broker_serving(ctx) as broker, resident.serving(ctx):
            outcome = _work(ctx)
        if broker.limit_reached is not None:  # a broker call ran out of a limit: that ends the task
            outcome = Failed(broker.limit_reached.message, recoverable=True, hint=broker.limit_reached.hint)
    except LeaseLost:
        if handing_back.is_set():
            _hand_back(run.pk, token, "the box is stopping", counts_as_attempt=False)
            return None
        log.info("run %s lost its lease; its late writes were refused", run.pk)
        _release_if_ended(task.pk)
        return None
    except TRANSIENT_DB_ERRORS as exc:
        log.warning("run %s hit a database fault; handing it back to retry: %s", run.pk, exc)
        _hand_back(run.pk, token, f"a database fault ({type(exc).__name__}: {first_line(exc)})", counts_as_attempt=True)
        return None
    except LimitReached as exc:
        outcome = Failed(exc.message, recoverable=True, hint=exc.hint)
    except Exception as exc:  # noqa: BLE001 - any crash of a worker fails its task, with the reason
        # The traceback may quote a secret (an argument, a command line): log it redacted.
        log.error("run %s crashed:\n%s", run.pk, recorder.redactor.text(traceback.format_exc()))
        outcome = Failed(f"the worker crashed: {type(exc).__name__}: {exc}", recoverable=True, hint="see the box's log")
    finally:
        heartbeats.forget(heartbeat)
        _current_stop = None
    held_s = ctx.held_s if ctx is not None else 0.0  # waiting for the owner is not running time
    return Ran(outcome, recorder, int((time.monotonic() - started - held_s) * 1000))


def _work(ctx: RunContext) -> Outcome:
    """The task's worker, then its output shaped to the task's ``output`` when it asks for one."""
    if SHAPE_RESUME in ctx.resume:  # the work is done; only its output waited for an OK
        return shape_output(ctx, Done(str(ctx.resume[SHAPE_RESUME])))
    outcome = worker_for(ctx.task.worker).run(ctx)
    if isinstance(outcome, Done) and ctx.task.output:
        outcome = shape_output(ctx, outcome)
    return outcome


# --- finish -----------------------------------------------------------------------------------

def _finish(begun: Begun, ran: Ran, goes_on: Callable[[], bool]) -> Next:
    """Apply the run's outcome; what the finish left for this worker (``_chain``)."""
    run, token = begun.run, begun.token
    task = run.task
    try:
        # A done task's layer is sealed beside its finish, off the path of a task chained after it.
        sealing = None
        if isinstance(ran.outcome, Done) and not task.criteria and not task.folders:
            sealing = sealer.seal_beside(task.pk, run.pk, token)
        try:
            finished = finish_run(task, run, token, ran.recorder, ran.outcome, ran.elapsed_ms, hand_over=True,
                                  claim_next=goes_on())
        finally:
            if sealing is not None:
                sealing.set()
    except LeaseLost:
        log.info("run %s lost its lease before finishing; its outcome was dropped", run.pk)
        _release_if_ended(task.pk)
        return _end()
    except TRANSIENT_DB_ERRORS as exc:
        log.warning("run %s hit a database fault while finishing; handing it back to retry: %s", run.pk, exc)
        _hand_back(run.pk, token, f"a database fault ({type(exc).__name__}: {first_line(exc)})", counts_as_attempt=True)
        return _end()
    return _chain(finished)


# --- chain ------------------------------------------------------------------------------------

def _chain(finished: Finished) -> Next:
    """The run the finish held back for this worker, with its claim, and the finish's releases,
    kept until that run's view is open; with none held, the releases go to the janitor at once."""
    if finished.held is None:
        lifecycle.submit_held(finished.releases)
        return _end()
    claimed = finished.claimed
    if claimed is not None and claimed.run.pk != finished.held:  # pragma: no cover - the first due is the first sent
        # Not the run this worker goes on with: handed back, so it resumes at once rather than
        # after its lease.
        log.error("run %s was claimed with its finish but run %s was held; it is handed back", claimed.run.pk, finished.held)
        _hand_back(claimed.run.pk, claimed.token, "claimed for a run its worker did not take", counts_as_attempt=False)
        claimed = None
    return Next(finished.held, finished.releases, claimed)


def _send(run_id: int) -> None:
    """Send a held run to the queue after all; if that fails, the scheduler sends it again."""
    try:
        runs.send(run_id)
    except Exception:  # noqa: BLE001 - the run is written as sent: ``stranded_runs`` finds it
        log.warning("run %s could not be sent; the scheduler sends it again", run_id, exc_info=True)


# --- when a run goes no further ---------------------------------------------------------------

def _release_if_ended(task_id: str) -> None:
    """A run that lost its lease because its task ended (a cancel, maybe from another machine,
    whose release cannot reach this machine's user and mounts): release it here too."""
    try:
        if Task.objects.filter(pk=task_id, state__in=FINAL).exists():
            lifecycle.release_soon(task_id)
    except TRANSIENT_DB_ERRORS:
        log.warning("could not check whether task %s ended; start-up reconcile releases it", task_id)


def _hand_back(run_id: int, token: str, why: str, *, counts_as_attempt: bool) -> None:
    """Hand the run back, retrying while the database recovers; past the lease, the reaper does it."""
    connection.close()  # the fault may have broken this connection: start a fresh one
    try:
        retried_within_lease(lambda: reaper.hand_back(run_id, token, why, counts_as_attempt=counts_as_attempt))
    except TRANSIENT_DB_ERRORS:
        log.warning("run %s could not be handed back; the reaper retries it once its lease expires", run_id)

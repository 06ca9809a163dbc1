"""django-q2 entry points. Thin and idempotent; they take ids."""
from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Callable

from django.conf import settings
from django.db import (
    close_old_connections,
    connection,
)

from tasks.broker.server import serving as broker_serving
from tasks.layers import sealer
from tasks.models import Task
from tasks.run import leases as runs
from tasks.run import lifecycle, reaper
from tasks.run.context import RunContext
from tasks.run.finish import Begun, begin_run, finish_run
from tasks.run.recorder import RETRY_PAUSE_S, TRANSIENT_DB_ERRORS, LeaseLost, LimitReached, StepRecorder
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


class Heartbeat:
    """One run's lease, extended every ``BOX_HEARTBEAT_SECONDS`` while the worker works (by the
    process's heartbeat thread, ``Heartbeats``); ``stop`` is set once the lease is gone."""

    def __init__(self, run_id: int, token: str, stop: threading.Event) -> None:
        self.run_id, self.token, self.stop_event = run_id, token, stop
        self.due = time.monotonic() + settings.BOX_HEARTBEAT_SECONDS


class Heartbeats:
    """The process's one heartbeat thread, kept for its life: it beats for every run it watches
    (in a worker, the run in hand). A thread started for each run would cost the run's start a
    wait for the new thread to take the GIL (long while the janitor's release computes). Started on
    first use; a forked child (a django-q2 worker) starts its own. Its database connection is
    closed whenever it watches nothing, so an idle worker holds none for it."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._watched: set[Heartbeat] = set()
        self._thread: threading.Thread | None = None

    def watch(self, run_id: int, token: str, stop: threading.Event) -> Heartbeat:
        """Extend run ``run_id``'s lease from now on, until ``forget``."""
        heartbeat = Heartbeat(run_id, token, stop)
        with self._changed:
            self._watched.add(heartbeat)
            if self._thread is None or not self._thread.is_alive():  # started once; again only if it died
                self._thread = threading.Thread(target=self._beat, name="box-heartbeats", daemon=True)
                self._thread.start()  # once per process, not on each run's path
            self._changed.notify()
        return heartbeat

    def forget(self, heartbeat: Heartbeat) -> None:
        """The run's work is over: it is not beaten again, but for a beat already begun (which
        then matches nothing, or extends a lease the run's finish is about to close)."""
        with self._changed:
            self._watched.discard(heartbeat)
            self._changed.notify()

    def _beat(self) -> None:
        while True:
            try:
                self._beat_due()
            except Exception:  # noqa: BLE001 - the one thread of every run of the process must go on
                log.exception("the heartbeat thread failed; it goes on")
                time.sleep(RETRY_PAUSE_S)

    def _beat_due(self) -> None:
        for heartbeat in self._due():
            try:
                alive = runs.heartbeat(heartbeat.run_id, heartbeat.token)
            except Exception:  # noqa: BLE001 - a busy database is retried next beat
                log.warning("heartbeat for run %s failed; retrying", heartbeat.run_id, exc_info=True)
                # On a fresh connection: this thread's may be broken for good (a terminated
                # backend), and nothing else in a thread ever replaces it.
                connection.close()
                alive = True
            with self._changed:
                if not alive and heartbeat in self._watched:
                    self._watched.discard(heartbeat)
                    heartbeat.stop_event.set()
                heartbeat.due = time.monotonic() + settings.BOX_HEARTBEAT_SECONDS

    def _due(self) -> list[Heartbeat]:
        """Wait until a watched run's beat is due: those runs. While nothing is watched the
        thread's connection is closed (out of the lock: ``watch`` never waits for it)."""
        closed = False
        while True:
            with self._changed:
                now = time.monotonic()
                due = [heartbeat for heartbeat in self._watched if heartbeat.due <= now]
                if due:
                    return due
                if self._watched:
                    self._changed.wait(min(heartbeat.due for heartbeat in self._watched) - now)
                    continue
                if closed:
                    self._changed.wait()
                    continue
            connection.close()  # this thread's own; the next beat opens one again
            closed = True


heartbeats = Heartbeats()


def execute_run(run_id: int) -> None:
    """Claim run ``run_id`` and execute it. A second delivery finds it claimed and returns.

    A run whose finish started another task's run (a dependent that was waiting on it) goes on
    with that run in the same worker, so a chain of tasks does not wait for the queue at each
    link. That run is held back from the queue (``runs.hold_first``): the other worker is not
    woken only to find it taken. When this worker goes on with it, the finish that started it
    claims it too, in the same transaction (``finish_run``'s ``claim_next``); it is sent instead
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

    held, releases, claimed = _execute(run_id, [], goes_on)
    while held is not None:
        if claimed is None and not goes_on():
            lifecycle.submit_held(releases)
            _send(held)
            return
        taking, taken = held, claimed
        try:
            held, releases, claimed = _execute(taking, releases, goes_on, taken)
        except BaseException as exc:
            lifecycle.submit_held(releases)  # the run before's: a no-op once ``_execute`` handed them over
            if taken is not None and isinstance(exc, Exception):
                # Claimed with the finish before: handed back, so it resumes at once (a hand-back
                # of a run that went further finds it closed, or gone from its lease, and is a no-op).
                _hand_back(taking, taken[1], f"its worker's job broke ({type(exc).__name__})", counts_as_attempt=False)
            else:
                # Perhaps claimed already (by ``_execute``, or with the finish before by a process
                # that is exiting): then that delivery finds it taken, and the reaper takes the
                # run back once its lease is gone.
                _send(taking)
            raise


def _send(run_id: int) -> None:
    """Send a held run to the queue after all; if that fails, the scheduler sends it again."""
    try:
        runs.send(run_id)
    except Exception:  # noqa: BLE001 - the run is written as sent: ``stranded_runs`` finds it
        log.warning("run %s could not be sent; the scheduler sends it again", run_id, exc_info=True)


# What ``_execute`` leaves for the worker: the run its finish held back for this worker (or
# None), the releases that finish asked for, and that run's claim when the finish made it.
Next = tuple[int | None, lifecycle.Held, Begun | None]


def _execute(run_id: int, before: lifecycle.Held, goes_on: Callable[[], bool], claimed: Begun | None = None) -> Next:
    """Claim run ``run_id`` (unless ``claimed``: the finish before claimed it) and execute it; the
    run its finish held back for this worker, if any, and the releases that finish asked for,
    kept until that run's view is open (``_execute`` again). ``before``: such releases of the run
    before, handed to the janitor once this run's view is open, or when it goes no further.
    ``goes_on``: whether this worker goes on with the next run, asked at the finish, which then
    claims it too (``finish_run``'s ``claim_next``)."""
    try:
        return _claim_and_execute(run_id, before, goes_on, claimed)
    finally:
        lifecycle.submit_held(before)  # emptied once handed over: a no-op after the view's opening


def _claim_and_execute(run_id: int, before: lifecycle.Held, goes_on: Callable[[], bool], claimed: Begun | None) -> Next:
    global _current_stop
    started = time.monotonic()
    if claimed is None:
        if handing_back.is_set():
            return None, [], None  # the cluster is stopping: the run stays queued and is sent again at start-up
        close_old_connections()
        _skip_the_health_check()
        try:
            claimed = begin_run(run_id)  # claimed, and the task running: one transaction
        except TRANSIENT_DB_ERRORS as exc:
            log.warning("run %s could not be claimed (a database fault: %s); the scheduler sends it again", run_id, _first_line(exc))
            return None, [], None
        if claimed is None:
            log.info("run %s is already taken or closed; nothing to do", run_id)
            return None, [], None
    # A run claimed with the finish before goes on as one claimed here would: a stop that came
    # since is set on it below, so its step stops and the run is handed back.
    run, token, go, redactor = claimed
    if not go or redactor is None:
        return None, [], None  # the task had ended, or another run holds it: the run was closed
    task = run.task
    facts = Facts.of(task)
    recorder = StepRecorder(task, run.pk, token, redactor)
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
        ctx = RunContext(task=task, run=run, workdir=workdir, facts=facts, recorder=recorder, deadline=deadline, stop=stop)
        # The task's processes reach the box through this run's broker, open while the worker works.
        with broker_serving(ctx) as broker:
            if SHAPE_RESUME in ctx.resume:  # the work is done; only its output waited for an OK
                outcome = shape_output(ctx, Done(str(ctx.resume[SHAPE_RESUME])))
            else:
                outcome = worker_for(task.worker).run(ctx)
                if isinstance(outcome, Done) and task.output:
                    outcome = shape_output(ctx, outcome)
        if broker.limit_reached is not None:  # a broker call ran out of a limit: that ends the task
            outcome = Failed(broker.limit_reached.message, recoverable=True, hint=broker.limit_reached.hint)
    except LeaseLost:
        if handing_back.is_set():
            _hand_back(run_id, token, "the box is stopping", counts_as_attempt=False)
            return None, [], None
        log.info("run %s lost its lease; its late writes were refused", run_id)
        _release_if_ended(task.pk)
        return None, [], None
    except TRANSIENT_DB_ERRORS as exc:
        log.warning("run %s hit a database fault; handing it back to retry: %s", run_id, exc)
        _hand_back(run_id, token, f"a database fault ({type(exc).__name__}: {_first_line(exc)})", counts_as_attempt=True)
        return None, [], None
    except LimitReached as exc:
        outcome = Failed(exc.message, recoverable=True, hint=exc.hint)
    except Exception as exc:  # noqa: BLE001 - any crash of a worker fails its task, with the reason
        # The traceback may quote a secret (an argument, a command line): log it redacted.
        log.error("run %s crashed:\n%s", run_id, recorder.redactor.text(traceback.format_exc()))
        outcome = Failed(f"the worker crashed: {type(exc).__name__}: {exc}", recoverable=True, hint="see the box's log")
    finally:
        heartbeats.forget(heartbeat)
        _current_stop = None
    held_s = ctx.held_s if ctx is not None else 0.0  # waiting for the owner is not running time
    elapsed_ms = int((time.monotonic() - started - held_s) * 1000)
    releases: lifecycle.Held = []
    try:
        with lifecycle.releases_held() as releases, runs.hold_first() as held:
            # A done task's layer is sealed beside its finish, off the path of a task chained after it.
            sealing = None
            if isinstance(outcome, Done) and not task.criteria and not task.folders:
                sealing = sealer.seal_beside(task.pk, run.pk, token)
            try:
                finished = finish_run(task, run, token, recorder, outcome, elapsed_ms, claim_next=goes_on())
            finally:
                if sealing is not None:
                    sealing.set()
            if finished.ended_meanwhile:
                # Ended meanwhile, maybe by a process on another machine whose release could not
                # reach what this run holds here (its user, its mounts): release it on this one.
                lifecycle.release_soon(task.pk)
        if held:
            pending, releases = releases, []
            next_claimed = finished.claimed
            if next_claimed is not None and next_claimed[0].pk != held[0]:  # pragma: no cover - the first due is the first sent
                # Not the run this worker goes on with: handed back, so it resumes at once rather
                # than after its lease.
                log.error("run %s was claimed with its finish but run %s was held; it is handed back",
                          next_claimed[0].pk, held[0])
                _hand_back(next_claimed[0].pk, next_claimed[1], "claimed for a run its worker did not take",
                           counts_as_attempt=False)
                next_claimed = None
            return held[0], pending, next_claimed  # released once the held run's view is open
    except LeaseLost:
        log.info("run %s lost its lease before finishing; its outcome was dropped", run_id)
        _release_if_ended(task.pk)
    except TRANSIENT_DB_ERRORS as exc:
        log.warning("run %s hit a database fault while finishing; handing it back to retry: %s", run_id, exc)
        _hand_back(run_id, token, f"a database fault ({type(exc).__name__}: {_first_line(exc)})", counts_as_attempt=True)
    finally:
        lifecycle.submit_held(releases)  # at once, unless a held run goes on first
    return None, [], None


def _skip_the_health_check() -> None:
    """The job's first statement goes without the health check's ``SELECT 1`` (a round trip before
    every job, ``CONN_HEALTH_CHECKS``): the claim is that statement, and ``begin_run`` tries its
    transaction again on a fresh connection when the kept one turns out dead."""
    if connection.connection is not None:
        connection.health_check_done = True  # type: ignore[attr-defined]  # the check's own flag (BaseDatabaseWrapper)


def _release_if_ended(task_id: str) -> None:
    """A run that lost its lease because its task ended (a cancel, maybe from another machine,
    whose release cannot reach this machine's user and mounts): release it here too."""
    try:
        if Task.objects.filter(pk=task_id, state__in=FINAL).exists():
            lifecycle.release_soon(task_id)
    except TRANSIENT_DB_ERRORS:
        log.warning("could not check whether task %s ended; start-up reconcile releases it", task_id)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _hand_back(run_id: int, token: str, why: str, *, counts_as_attempt: bool) -> None:
    """Hand the run back, retrying while the database recovers; past the lease, the reaper does it."""
    deadline = time.monotonic() + settings.BOX_LEASE_SECONDS
    while True:
        connection.close()  # the fault may have broken this connection: start a fresh one
        try:
            reaper.hand_back(run_id, token, why, counts_as_attempt=counts_as_attempt)
            return
        except TRANSIENT_DB_ERRORS:
            if time.monotonic() > deadline:
                log.warning("run %s could not be handed back; the reaper retries it once its lease expires", run_id)
                return
            time.sleep(0.5)

"""The edges of a run: moving the task to running when it starts, and applying its outcome."""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction

from boxsite.core import reads
from tasks import pauses, services
from tasks.models import EventKind, Run, RunKind, Task
from tasks.run import completion, lifecycle
from tasks.run import leases as runs
from tasks.run.handover import Handover
from tasks.run.recorder import TRANSIENT_DB_ERRORS, LeaseLost, StepRecorder, retried_within_lease
from tasks.sandbox import support
from tasks.sandbox.isolation import isolation_note, isolation_of
from tasks.states import Review, State, WaitingFor
from tasks.vault.facts import Redactor, redactor_for, refreshed
from tasks.workers.base import Continue, Done, Failed, Outcome, Paused

log = logging.getLogger(__name__)


class Begun(NamedTuple):
    """A claimed run (``begin_run``): the run, its lease token, whether to go on, and its
    redactor (None when the run was closed at its claim)."""

    run: Run
    token: str
    go: bool
    redactor: Redactor | None


class Finished(NamedTuple):
    """What ``finish_run`` did: whether the task had ended meanwhile; with ``hand_over``, the run
    it made due and held back from the queue for the caller (``held``), that run's claim when it
    made it in the same transaction (``claim_next``), and the releases it asked for, kept for the
    caller to hand to the janitor (``lifecycle.submit_held``): the finish's ``Handover``."""

    ended_meanwhile: bool
    claimed: Begun | None
    held: int | None
    releases: lifecycle.Held


def begin_run(run_id: int) -> Begun | None:
    """Claim run ``run_id`` and move its task to running, with its isolation note: one
    transaction, the task's row locked before the run's (the one lock order). None when
    someone else has the run (a second delivery) or it is closed. Else the run, its lease token,
    whether to go on, and the run's redactor (the vault as the claim read it, so the run does not
    read its stamp again right after): not to go on when the task already ended, or another run
    of it still holds a live process; the run is closed in the same transaction then (no redactor).

    A transient database fault is tried again in place (nothing is held until the commit); past
    a lease the fault goes up, and the run, still queued, is sent again by the scheduler."""
    def claim_and_begin() -> Begun | None:
        with transaction.atomic():
            return _claim_and_begin(run_id)

    return retried_within_lease(claim_and_begin)


def _claim_and_begin(run_id: int, *, task_locked: bool = False, handover: Handover | None = None) -> Begun | None:
    """``task_locked``: this transaction holds the row of the run's task already. ``handover``:
    the claim is a finish's (``_claim_in_finish``), which keeps what the task's moves ask for."""
    if not task_locked and runs.lock_task_of_queued(run_id) is None:
        return None
    claimed = runs.claim(run_id)
    if claimed is None:
        return None
    run, token = claimed
    task = run.task
    if task.is_final():
        runs.finish(run.pk, token, "cancelled", f"the task is already {task.state}")
        return Begun(run, token, False, None)
    if run.others_running:  # type: ignore[attr-defined]  # annotated by runs.claim
        # Another run still holds a live process that waits on the owner in its broker
        # (tasks.broker.holds); it goes on by itself once the pause is decided.
        runs.finish(run.pk, token, "superseded", "a held run of this task is still running", charged=False)
        return Begun(run, token, False, None)
    refused = support.refusal()
    if refused is not None:
        # Never unsandboxed without being told: the task fails before anything of it runs, and a
        # retry once the owner fixed the box (root, or BOX_SANDBOX=off) starts it.
        runs.finish(run.pk, token, "failed", refused)
        services.fail_task(task, refused, recoverable=True, hint=support.FIX, handover=handover)
        return Begun(run, token, False, None)
    redactor = redactor_for(task)
    if task.state == State.QUEUED and task.started_at is None:
        # The task's first words after it starts: what confines it (stored with the move).
        line, described = isolation_of(task)
        services.transition(task, State.RUNNING, summary="running", data={"run": run.number},
                            redactor=redactor, isolation=line, notes=[isolation_note(described)], handover=handover)
    elif task.state in (State.QUEUED, State.WAITING):  # retried after a failure (verbs.retry_task), or resumed
        services.transition(task, State.RUNNING, summary="running again", data={"run": run.number}, redactor=redactor,
                            handover=handover)
    return Begun(run, token, True, redactor)


def finish_run(task: Task, run: Run, token: str, recorder: StepRecorder, outcome: Outcome, elapsed_ms: int, *,
               hand_over: bool = False, claim_next: bool = False) -> Finished:
    """Apply a run's outcome to its task, in one transaction that proves the lease first; whether
    the task had ended meanwhile (cancelled, perhaps by a process on another machine: what the
    run holds on this machine is released here then).

    A plain end (done, no completion criteria) proves the lease by closing the run, the first
    write to it: that update is conditional on the run's state and token as the heartbeat's is,
    and nobody changes either without the task's row, which the transaction holds. Every other
    outcome writes events or blockers first, after the heartbeat's proof.

    ``hand_over`` (the worker, ``tasks.run.worker``): the first run due now that the outcome
    created (a dependent's first run, say) is held back from the queue for the caller to run or
    send (``Finished.held``), and the releases the finish asks for are kept for the caller to
    hand to the janitor once it opened that run's view (``Finished.releases``). ``claim_next``
    (with ``hand_over``: the worker goes on with that run): it is claimed and its task moved to
    running in the same transaction (``begin_run``'s work), so a chain's link commits once, not
    once for the finish and once for the claim. Its claim is in a savepoint of its own: one
    that fails leaves the finish whole, and the run is claimed after the commit as any other."""

    kept = Handover(keep=hand_over)
    try:
        # The vault's stamp (and the settings row) are read once for the whole finish: the
        # outcome's redactor, and the dependents it starts (their notes', their claim's).
        with reads.read_once():
            ended, claimed = _finish(task, run, token, recorder, outcome, elapsed_ms, kept, claim_next)
            if ended:
                lifecycle.release_soon(task.pk, handover=kept)
    except BaseException:
        lifecycle.submit_held(kept.releases)
        raise
    return Finished(ended, claimed, kept.held, kept.releases)


def _finish(task: Task, run: Run, token: str, recorder: StepRecorder, outcome: Outcome, elapsed_ms: int,
            kept: Handover, claim_next: bool) -> tuple[bool, Begun | None]:
    # As the vault stands now: a secret added while the run ran is masked in its outcome too.
    redact = recorder.redactor = refreshed(recorder.redactor)
    plain_end = isinstance(outcome, Done) and not task.criteria
    claimed: Begun | None = None

    def write_and_claim() -> bool:
        nonlocal claimed
        claimed = None  # a transaction tried again claims again
        kept.noted.clear()  # and notes its runs again
        ended = write()
        if claim_next and kept.noted and not ended:
            claimed = _claim_in_finish(kept.noted[0], kept)
        return ended

    def close(how: str, error: str = "") -> None:
        if not runs.finish(run.pk, token, how, error):
            raise LeaseLost(f"run {run.pk} no longer holds its lease")

    def write() -> bool:
        task.spent = {**task.spent, "elapsed_ms": task.spent.get("elapsed_ms", 0) + elapsed_ms}
        spent_with_move = plain_end and not task.is_final()
        if not spent_with_move:
            Task.objects.filter(pk=task.pk).update(spent=task.spent)
        if task.is_final():
            close("cancelled", f"the task became {task.state} meanwhile")
            return True
        # The run is closed before the task moves: a final move closes every open run.
        if isinstance(outcome, Done) and task.criteria and not _meets_criteria(task, run, token, recorder, kept):
            return False  # repaired, asked about, or failed: the task did not become done
        if isinstance(outcome, Done):
            close("done")
            review: dict[str, Any] = {"review": Review.PENDING} if task.folders else {}  # a folder task waits for Keep/Undo
            if spent_with_move:
                review["spent"] = task.spent
            services.transition(task, State.DONE, summary=outcome.summary, progress=1.0, redactor=redact, handover=kept,
                                **review)
        elif isinstance(outcome, Failed):
            # An error often quotes what a step printed; it is stored and shown only redacted.
            error, hint = redact.text(outcome.error), redact.text(outcome.hint)
            recorder.event(EventKind.ERROR, error, {"recoverable": outcome.recoverable, "hint": hint})
            runs.finish(run.pk, token, "failed", error)
            services.fail_task(task, error, recoverable=outcome.recoverable, hint=hint, redactor=redact, handover=kept)
        elif isinstance(outcome, Paused):
            _pause(task, run, token, outcome, redact, kept)
        elif isinstance(outcome, Continue):
            runs.finish(run.pk, token, "continued")
            Task.objects.filter(pk=task.pk).update(resume=outcome.resume)
            runs.create_run(task, RunKind.RESUME, resume=outcome.resume, handover=kept)
        else:  # pragma: no cover - a worker bug
            raise TypeError(f"unknown outcome {outcome!r}")
        return False

    # The task as it stands now (a cancel may have come).
    ended = recorder.guarded(write_and_claim, fresh=task, write_proves_lease=plain_end)
    return ended, claimed


def _claim_in_finish(run_id: int, kept: Handover) -> Begun | None:
    """``begin_run``'s claim inside a finish's transaction, in a savepoint; None, the savepoint
    undone, when it fails (the run stays queued and is claimed after the commit). A transient
    database fault goes up: the finish's transaction is lost with it and tried again whole."""
    try:
        with transaction.atomic():
            # A run the finish made due was made under its task's row lock, in this transaction
            # (``runs.create_run``): the lock is held (a savepoint undone took the run with it).
            return _claim_and_begin(run_id, task_locked=True, handover=kept)
    except TRANSIENT_DB_ERRORS:
        raise
    except Exception:  # noqa: BLE001 - the finish must land; the run is claimed the usual way
        log.exception("run %s could not be claimed with the finish that started it; it is claimed after", run_id)
        return None


def _meets_criteria(task: Task, run: Run, token: str, recorder: StepRecorder, kept: Handover) -> bool:
    """Check the completion contract from what the run really left (``tasks.run.completion``). On a
    failure: one automatic repair run while attempts remain, then one inbox question whose answer
    runs the task again; with no attempt left the task fails with the report."""
    report = completion.evaluate(task, run)
    summary = "completion criteria met" if report.ok else f"completion criteria not met: {report.failures()}"
    recorder.event(EventKind.NOTE, summary, {"completion": report.results, "ok": report.ok})
    if report.ok:
        return True
    why = recorder.redactor.text(report.failures())
    charged = Run.objects.filter(task=task, started_at__isnull=False, charged=True).count()
    if charged >= settings.BOX_MAX_RUN_ATTEMPTS:
        runs.finish(run.pk, token, "criteria failed", why)
        # Not recoverable: a retry resumes after the last step, so it would only check the same
        # files again. What helps is changed work or criteria: Run again, edited.
        services.fail_task(task, f"completion criteria not met after {charged} attempts: {why}", recoverable=False,
                           hint="see the completion report in the log; fix the work or the criteria and run it again",
                           handover=kept)
    elif not Run.objects.filter(task=task, kind=RunKind.REPAIR).exists():
        # Logged while the run still holds its lease: a write after ``runs.finish`` is refused.
        recorder.event(EventKind.NOTE, "one automatic repair run: the task runs again", {"repair": why})
        runs.finish(run.pk, token, "criteria failed", why)
        runs.create_run(task, RunKind.REPAIR, resume={"repair": why}, handover=kept)
    else:
        _pause(task, run, token, Paused(
            waiting_for=WaitingFor.HUMAN, resume={"repair": why},
            message=f"the task finished but its completion criteria are not met ({why}); "
                    "fix what is needed, then continue to run it again"), recorder.redactor, kept, charged=True)
    return False


def _pause(task: Task, run: Run, token: str, outcome: Paused, redact: Redactor, kept: Handover, *,
           charged: bool = False) -> None:
    """Move the task to waiting with what the pause asks for, then open its blockers."""

    message = redact.text(outcome.message)
    pause: dict[str, Any] = {"message": message}
    if outcome.fields:
        pause["fields"] = redact.redact(outcome.fields)
    if outcome.waiting_for == WaitingFor.CHECKPOINT:
        pause["continuable"] = outcome.continuable
    services.transition(
        task, State.WAITING, summary=f"waiting for {outcome.waiting_for}: {message}",
        waiting_for=outcome.waiting_for, pause=pause, resume=outcome.resume, continuable=outcome.continuable,
        handover=kept,
    )
    pauses.blockers().open_blockers_for_pause(task, run, outcome)
    # A wait for the owner is refunded; a repair question after a completed run is not.
    runs.finish(run.pk, token, f"waiting:{outcome.waiting_for}", charged=charged)

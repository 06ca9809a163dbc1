"""Consequential actions: the one writer of ``Action`` and ``ActionDay`` rows.

A call that acts for good (a tool marked irreversible, a flow's ``http`` step with
``stop_before``) is an action (docs/internals/task-graph.md#consequential-actions):

1. ``propose`` finds it by its idempotency key (task, position, real arguments) or creates it,
   with its arguments redacted and a snapshot of the task's version and the policy that lets it
   through. A resumed run finds the same row, so what it learns there decides what happens:
   ``succeeded`` returns the receipt, ``failed`` the failure, ``unknown`` waits for the owner,
   and ``executing`` under a run that is gone becomes ``unknown`` (nobody can say whether the
   call reached its provider; it is never called again by itself).
2. ``begin`` lets the call through exactly once: ``proposed``/``approved`` → ``executing``,
   fenced by the run and its lease token, and counted on the owner's calendar day.
3. ``succeed`` / ``fail`` store the receipt of a confirmed outcome, only while that fence holds.
4. ``reconcile`` records the owner's word on an unknown one: it happened (``succeeded``, never
   called again), it did not (``approved``: the next run calls it), or fail the task.

Every write here runs inside a transaction that holds the task's row: the worker's lease-checked
writes (``StepRecorder.guarded``), the final-move cleanup, or an answer. The workers and the tool
registry, in ``tasks`` below this app, call it through ``tasks.pauses.actions()``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from datetime import date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from approvals.models import (
    NOT_STARTED,
    Action,
    ActionDay,
    ActionKind,
    ActionState,
    Approval,
    Question,
    Reconciliation,
)
from boxsite.models import BoxSettings
from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.pauses import ActionFailedBefore, ActionUnknown
from tasks.run.recorder import LeaseLost, StepRecorder
from tasks.vault.facts import Redactor

RECONCILE_FIELD = "outcome"
RECONCILE_OPTIONS = [choice.value for choice in Reconciliation]


def idempotency_key(task_id: str, position: str, args: Any) -> str:
    """The same task, position and real arguments give the same key. Keyed with the site's
    secret, so a key does not let anyone test guesses of a secret argument."""
    canonical = json.dumps([task_id, position, args], sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(settings.SECRET_KEY.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def policy_of(task: Task, **extra: Any) -> dict[str, Any]:
    """What lets an action through, as it stands when it is proposed."""
    allowed = bool((task.constraints or {}).get("allow_destructive"))
    return {"approval": "not needed: the task allows destructive steps" if allowed else "the owner's",
            "allowDestructive": allowed, "hosts": list(task.hosts or []), "budgetCents": task.budget_cents, **extra}


# --- the worker's side (inside StepRecorder.guarded) ------------------------------------------

def propose(recorder: StepRecorder, run_id: int, *, kind: ActionKind, target: str, position: str, args: Any,
            policy: dict[str, Any]) -> Action:
    """The action for this call: found by its key, else created ``proposed``. An ``executing``
    one whose fence is not this run's lease was cut off mid-call: it becomes ``unknown``."""
    task_id = recorder.task.pk
    key = idempotency_key(task_id, position, args)

    def write() -> Action:
        action = Action.objects.filter(idempotency_key=key).first()
        if action is None:
            version = Task.objects.values_list("version", flat=True).get(pk=task_id)
            return Action.objects.create(
                task_id=task_id, run_id=run_id, kind=kind, tool=recorder.redactor.text(target)[:500], position=position,
                args=recorder.redactor.redact(args), idempotency_key=key, task_version=version, policy=policy,
            )
        if action.state == ActionState.CANCELLED:
            # Cancelled when the task ended before it started, and the task goes on again (a
            # retry in place): it never reached a provider, so it is proposed anew.
            version = Task.objects.values_list("version", flat=True).get(pk=task_id)
            Action.objects.filter(pk=action.pk, state=ActionState.CANCELLED).update(
                state=ActionState.PROPOSED, run_id=run_id, approval=None, settled_at=None, task_version=version)
            action.refresh_from_db()
        elif action.state == ActionState.EXECUTING and not (action.run_id == run_id and action.lease_token == recorder.token):
            # This run holds the task's lease, so the run that attempted the call has lost its own.
            error = "the worker stopped between attempting the call and recording its receipt"
            Action.objects.filter(pk=action.pk, state=ActionState.EXECUTING, lease_token=action.lease_token).update(
                state=ActionState.UNKNOWN, settled_at=timezone.now(), error=error)
            action.refresh_from_db()
            record_event(recorder.task, EventKind.NOTE, f"action {action.pk} ({action.tool}): outcome unknown; "
                         "it will not be called again unless the owner says it did not happen",
                         {"action": action.pk, "state": action.state}, redactor=recorder.redactor)
        return action

    return recorder.guarded(write)


def replayed_receipt(action: Action) -> dict[str, Any] | None:
    """What a call that already settled answers instead of calling again: the receipt of a
    ``succeeded`` action; ``ActionFailedBefore``/``ActionUnknown`` for the others; None when the
    action has not been attempted (it may go ahead)."""
    if action.state == ActionState.SUCCEEDED:
        return dict(action.receipt or {})
    if action.state == ActionState.FAILED:
        raise ActionFailedBefore(action)
    if action.state in (ActionState.UNKNOWN, ActionState.EXECUTING):
        raise ActionUnknown(action)
    return None


def begin(recorder: StepRecorder, run_id: int, action: Action) -> None:
    """Let the call through: ``executing``, fenced by this run's lease, counted on the owner's day."""

    def write() -> None:
        now = timezone.now()
        moved = Action.objects.filter(pk=action.pk, state__in=NOT_STARTED).update(
            state=ActionState.EXECUTING, run_id=run_id, lease_token=recorder.token, attempted_at=now)
        if moved != 1:
            raise LeaseLost(f"action {action.pk} is no longer waiting to start")
        _count_day(recorder.task, now, recorder.redactor)

    recorder.guarded(write)
    action.state, action.run_id, action.lease_token = ActionState.EXECUTING, run_id, recorder.token


def succeed(recorder: StepRecorder, action: Action, receipt: dict[str, Any]) -> None:
    _settle(recorder, action, ActionState.SUCCEEDED, receipt, "")


def fail(recorder: StepRecorder, action: Action, receipt: dict[str, Any], error: str) -> None:
    _settle(recorder, action, ActionState.FAILED, receipt, error)


def uncertain(recorder: StepRecorder, action: Action, error: str) -> None:
    """The call may or may not have taken effect (a reset, a timeout): ``unknown``."""
    _settle(recorder, action, ActionState.UNKNOWN, None, error)


def _settle(recorder: StepRecorder, action: Action, state: ActionState, receipt: dict[str, Any] | None, error: str) -> None:
    """Store a confirmed outcome, only while this run's fence holds (else the action stays
    ``executing`` and the next run finds it ``unknown``)."""

    stored_error = recorder.redactor.text(error)[:500]

    def write() -> None:
        moved = Action.objects.filter(pk=action.pk, state=ActionState.EXECUTING, run_id=recorder.run_id,
                                      lease_token=recorder.token).update(
            state=state, receipt=None if receipt is None else recorder.redactor.redact(receipt), error=stored_error,
            settled_at=timezone.now())
        if moved != 1:
            raise LeaseLost(f"action {action.pk} is no longer this run's")

    recorder.guarded(write)
    # The caller may go on to say why (``ActionUnknown``): with this call's own reason, not a guess.
    action.state, action.error = state, stored_error


def owner_day(box: BoxSettings, when: datetime) -> date:
    """The day of the owner's calendar ``when`` falls on."""
    return timezone.localtime(when, ZoneInfo(box.time_zone)).date()


def actions_today(box: BoxSettings) -> int:
    return ActionDay.objects.filter(day=owner_day(box, timezone.now())).values_list("count", flat=True).first() or 0


def _count_day(task: Task, now: datetime, redactor: Redactor) -> None:
    """Count one attempt on the owner's calendar day; the attempt that reaches the maximum tells
    the owner (a note in its task's log, which the owner's live stream carries), once a day."""
    box = BoxSettings.current()
    day = owner_day(box, now)
    ActionDay.objects.bulk_create([ActionDay(day=day)], ignore_conflicts=True)
    # Locked: concurrent attempts count one after another, so exactly one reaches the maximum.
    entry = ActionDay.objects.select_for_update().get(day=day)
    count = entry.count + 1
    maximum = box.max_actions_per_day
    notify = maximum is not None and count >= maximum and entry.notified_at is None
    ActionDay.objects.filter(pk=entry.pk).update(count=count, **({"notified_at": now} if notify else {}))
    if notify:
        record_event(task, EventKind.NOTE, f"the box has attempted {count} consequential actions today ({day.isoformat()}, "
                     f"{box.time_zone}), its daily maximum of {maximum}; actions go on",
                     {"notice": "daily_actions", "day": day.isoformat(), "count": count, "max": maximum}, redactor=redactor)


# --- the owner's side (inside the transaction of a decision, an answer or a final move) --------

def mark_approved(approval: Approval) -> None:
    """The owner approved the approval that guards an action: it may start."""
    action_id = (approval.guard or {}).get("action")
    if isinstance(action_id, int):
        Action.objects.filter(pk=action_id, task_id=approval.task_id, state=ActionState.PROPOSED).update(
            state=ActionState.APPROVED, approval=approval)


def link_question(action_id: int, question: Question) -> None:
    Action.objects.filter(pk=action_id, state=ActionState.UNKNOWN).update(question=question)


def cancel_not_started(task: Task) -> int:
    """Call inside the transaction that ends ``task``: actions that have not reached their
    provider are cancelled; executing and unknown ones keep what is known of them."""
    return Action.objects.filter(task=task, state__in=NOT_STARTED).update(
        state=ActionState.CANCELLED, settled_at=timezone.now())


def close_in_flight(task: Task, why: str, *, run_id: int | None = None) -> int:
    """Call inside the transaction that ends ``task`` (or, with ``run_id``, that marks that run
    lost): a call in flight (``executing``) whose run will never record its receipt becomes
    ``unknown``, since nobody can say whether it reached its provider. The log says so."""
    in_flight = Action.objects.filter(task=task, state=ActionState.EXECUTING)
    if run_id is not None:
        in_flight = in_flight.filter(run_id=run_id)
    closed = 0
    for action in in_flight:
        closed += Action.objects.filter(pk=action.pk, state=ActionState.EXECUTING).update(
            state=ActionState.UNKNOWN, settled_at=timezone.now(), error=why[:500])
        record_event(task, EventKind.NOTE, f"action {action.pk} ({action.tool}): outcome unknown ({why}); "
                     "it will not be called again unless the owner says it did not happen",
                     {"action": action.pk, "state": ActionState.UNKNOWN})
    return closed


def action_for_question(question: Question) -> Action | None:
    return Action.objects.filter(question=question, state=ActionState.UNKNOWN).first()


def reconcile(task: Task, action: Action, choice: Reconciliation, user: AbstractBaseUser, via: str) -> None:
    """Record the owner's word on an unknown action. Nothing is called here: ``happened`` settles
    it (a resumed run finds it done), ``did_not_happen`` lets the next run attempt it, ``fail``
    settles it failed (the caller fails the task)."""
    now = timezone.now()
    common: dict[str, Any] = {"reconciliation": choice, "reconciled_by": user, "reconciled_at": now}
    if choice == Reconciliation.HAPPENED:
        changes = {"state": ActionState.SUCCEEDED, "settled_at": now,
                   "receipt": {"reconciled": choice.value, "by": via}, "error": ""}
        said = "it happened; it will not be called again"
    elif choice == Reconciliation.NOT_HAPPENED:
        changes = {"state": ActionState.APPROVED, "settled_at": None, "lease_token": "", "error": ""}
        said = "it did not happen; the task runs it again"
    else:
        changes = {"state": ActionState.FAILED, "settled_at": now, "error": f"the owner failed the task ({via})"}
        said = "fail the task"
    Action.objects.filter(pk=action.pk, state=ActionState.UNKNOWN).update(**common, **changes)
    record_event(task, EventKind.NOTE, f"action {action.pk} ({action.tool}): the owner said {said}",
                 {"action": action.pk, "reconciliation": choice.value, "via": via})


def reconcile_fields() -> list[dict[str, Any]]:
    return [{"name": RECONCILE_FIELD, "kind": "choice", "options": RECONCILE_OPTIONS,
             "why": "happened: it took effect, go on without calling it again; did_not_happen: run it again; "
                    "fail: fail the task"}]

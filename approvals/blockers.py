"""Blockers: the one home of a pause's approvals and questions.

A waiting task's **blockers** are its pending approvals and open questions. This module is the
only writer of their rows: it opens them when a task pauses (``open_blockers_for_pause``, or at
once for a pause a live process holds: ``request_approval``, ``open_question``), closes them one
at a time as the owner decides and answers (``record_decision``, ``record_answer``), binds those
still open to the task's new version when an answer bumps it (``bind_to_version``), closes every
one of them when the task ends (``close_for_final_move``), and queues the run that goes on once
none remains (``resume_if_clear``).

What the owner may decide, and how a body is checked, is ``approvals.services``; moving the task
is ``tasks.services``. ``tasks``, below this app, reaches it through ``tasks.pauses.blockers()``.
See docs/internals/approvals.md#a-pauses-life.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet
from django.utils import timezone

from approvals import actions, sql
from approvals.models import (
    Approval,
    ApprovalKind,
    ApprovalState,
    Question,
    QuestionKind,
    QuestionState,
)
from tasks.events import record_event
from tasks.models import EventKind, Run, RunKind, Task
from tasks.run import leases as runs
from tasks.states import State, WaitingFor
from tasks.vault.facts import guess_kind, redactor_for

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from tasks.workers.base import Paused

# How an approval the task's end closed says it was decided.
ENDED_WITH_TASK = "task-ended"


# --- opening ----------------------------------------------------------------------------------

def request_approval(
    task: Task,
    kind: ApprovalKind,
    summary: str,
    detail: dict[str, Any] | None = None,
    guard: dict[str, Any] | None = None,
    amount_cents: int = 0,
) -> Approval:
    """Open a pending approval for ``task`` and log it. For the broker and for pauses.

    Call inside the transaction that moved ``task`` to waiting/approval (or, for a run that will
    end waiting, inside any of its writes: ``open_blockers_for_pause`` binds it to the waiting
    version when the run ends). ``kind`` is an ``ApprovalKind`` (irreversible, spending, action,
    payment, checkpoint). ``guard`` names exactly what the OK allows; ``guard["held_run"]`` means
    a live process waits on the decision in that run's broker, so deciding never queues a new
    run while that run is alive (the broker sees the decision and goes on). ``amount_cents`` is,
    for spending approvals, how much more budget the call asks for; approving raises the budget
    to ``guard["budget_cents"]`` (the budget when asked; else the current one) plus that amount.
    ``summary``, ``detail`` and the text in ``guard`` are redacted with the task's secrets before
    they are stored (a guarded tool call's arguments may carry them).
    """
    redact = redactor_for(task)
    approval = Approval.objects.create(
        task=task, kind=kind, summary=redact.text(summary)[:500], detail=redact.redact(detail or {}),
        guard=redact.redact(guard or {}), amount_cents=amount_cents, task_version=task.version,
    )
    record_event(task, EventKind.APPROVAL, f"approval needed: {approval.summary}",
                 {"approval": approval.pk, "kind": kind, "amount_cents": amount_cents}, redactor=redact)
    return approval


def stage_question(task: Task, run: Run | None, kind: QuestionKind, prompt: str, fields: list[dict[str, Any]] | None = None) -> Question:
    """Stage a question during a run. It stays out of the inbox until the run ends waiting
    (``open_blockers_for_pause``); a run that ends otherwise cancels it with the task's cleanup."""
    redact = redactor_for(task)
    return Question.objects.create(
        task=task, run=run, kind=kind, prompt=redact.text(prompt)[:500], fields=_clean_fields(fields or []),
        state=QuestionState.STAGED,
    )


def open_question(task: Task, run: Run | None, kind: QuestionKind, prompt: str, fields: list[dict[str, Any]] | None = None) -> Question:
    """Open a human-inbox question at once (not staged) and log it.

    Call inside the transaction that moved ``task`` to waiting, for a pause a live process waits on.
    """
    redact = redactor_for(task)
    question = Question.objects.create(
        task=task, run=run, kind=kind, prompt=redact.text(prompt)[:500], fields=_clean_fields(fields or []),
        state=QuestionState.OPEN, task_version=task.version,
    )
    record_event(task, EventKind.QUESTION, f"question: {question.prompt}",
                 {"question": question.pk, "kind": kind, "fields": question.fields}, redactor=redact)
    return question


def open_blockers_for_pause(task: Task, run: Run, outcome: Paused) -> None:
    """Call inside the transaction that moved ``task`` to waiting.

    Creates the approval the pause asks for, turns missing inputs and a person's wall into
    questions, opens every question the run staged, and binds all of them (and approvals asked
    for during the run) to the task's new version.
    """
    redact = redactor_for(task)
    if outcome.approval is not None:
        asked = outcome.approval
        request_approval(task, asked.kind, asked.summary, asked.detail, asked.guard, asked.amount_cents)
    if outcome.fields and outcome.waiting_for != WaitingFor.HUMAN:
        stage_question(task, run, QuestionKind.INPUT, outcome.message, outcome.fields)
    if outcome.reconcile is not None:
        # A person's word on an action whose outcome is unknown, instead of a wall to get past.
        question = stage_question(task, run, QuestionKind.ACTION, outcome.message, actions.reconcile_fields())
        actions.link_question(outcome.reconcile, question)
    elif outcome.waiting_for == WaitingFor.HUMAN:
        # A wall's question may ask for a value too (a one-time code), answered with it.
        stage_question(task, run, QuestionKind.HUMAN, outcome.message, outcome.fields)
    staged = list(Question.objects.filter(task=task, state=QuestionState.STAGED).order_by("pk"))
    for question in staged:
        record_event(task, EventKind.QUESTION, f"question: {question.prompt}",
                     {"question": question.pk, "kind": question.kind, "fields": question.fields}, redactor=redact)
    Question.objects.filter(pk__in=[q.pk for q in staged]).update(
        state=QuestionState.OPEN, task_version=task.version, created_at=timezone.now())
    Approval.objects.filter(task=task, state=ApprovalState.PENDING).update(task_version=task.version)


def _clean_fields(fields: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input fields in one shape: name, why, kind (guessed from the name), options; ``optional``
    on a field that may be left empty."""
    out = []
    for f in fields:
        name = str(f["name"])
        out.append({"name": name, "why": str(f.get("why") or f"the task needs {name}"),
                    "kind": str(f.get("kind") or guess_kind(name)), "options": list(f.get("options") or []),
                    **({"optional": True} if f.get("optional") else {})})
    return out


# --- reading ----------------------------------------------------------------------------------

def pending_approvals(task: Task) -> QuerySet[Approval]:
    return Approval.objects.filter(task=task, state=ApprovalState.PENDING).order_by("pk")


def open_questions(task: Task) -> QuerySet[Question]:
    return Question.objects.filter(task=task, state=QuestionState.OPEN).order_by("pk")


def has_blockers(task: Task) -> bool:
    return pending_approvals(task).exists() or open_questions(task).exists()


def approval_state(approval_id: int) -> str | None:
    """An approval's state as stored now (a held broker call polls it)."""
    return Approval.objects.filter(pk=approval_id).values_list("state", flat=True).first()


def question_state(question_id: int) -> str | None:
    return Question.objects.filter(pk=question_id).values_list("state", flat=True).first()


def question_outcome(question_id: int) -> tuple[str, Any]:
    """A closed question's state and (redacted) answer, for the held call that asked it."""
    question = Question.objects.get(pk=question_id)
    return question.state, question.answer


# --- closing ----------------------------------------------------------------------------------

def record_decision(approval: Approval, decision: ApprovalState, user: AbstractBaseUser, via: str) -> bool:
    """Close a pending approval as approved or denied. False when it was no longer pending."""
    return Approval.objects.filter(pk=approval.pk, state=ApprovalState.PENDING).update(
        state=decision, decided_by=user, decided_via=via, decided_at=timezone.now()) == 1


def mark_stale(approval_id: int) -> None:
    """The task moved on since the approval was asked: it can never be decided."""
    Approval.objects.filter(pk=approval_id, state=ApprovalState.PENDING).update(state=ApprovalState.STALE)


def record_answer(question: Question, answer: dict[str, Any], user: AbstractBaseUser, via: str, when: datetime) -> None:
    """Close an open question with its (redacted) answer."""
    Question.objects.filter(pk=question.pk, state=QuestionState.OPEN).update(
        state=QuestionState.ANSWERED, answer=answer, answered_by=user, answered_via=via, answered_at=when)


def bind_to_version(task: Task, old_version: int) -> None:
    """After a version bump that is not a move: the blockers still open belong to the same pause."""
    Approval.objects.filter(task=task, state=ApprovalState.PENDING, task_version=old_version).update(
        task_version=task.version)
    Question.objects.filter(task=task, state=QuestionState.OPEN, task_version=old_version).update(
        task_version=task.version)


def close_for_final_move(task: Task) -> None:
    """Call inside the transaction that ends ``task``: pending approvals are denied, open and
    staged questions cancelled, actions that have not started cancelled, and a call in flight
    closed as ``unknown`` (its worker's receipt can no longer be recorded). One query first says
    whether anything is open: most tasks end with nothing to close."""
    if not _has_open(task):
        return
    Approval.objects.filter(task=task, state=ApprovalState.PENDING).update(
        state=ApprovalState.DENIED, decided_via=ENDED_WITH_TASK, decided_at=timezone.now())
    Question.objects.filter(task=task, state__in=[QuestionState.STAGED, QuestionState.OPEN]).update(
        state=QuestionState.CANCELLED)
    actions.cancel_not_started(task)
    actions.close_in_flight(task, "the task ended while the call was in flight")


def _has_open(task: Task) -> bool:
    """``task`` has a row ``close_for_final_move`` would change: every task's final move asks."""
    return sql.has_open_blockers(task.pk)


# --- resuming ---------------------------------------------------------------------------------

def resume_if_clear(task: Task) -> Run | None:
    """Queue the run that goes on from the pause, once nothing blocks and nothing holds it."""

    if task.state != State.WAITING or has_blockers(task):
        return None
    if runs.active_run(task) is not None:
        return None  # a live process holds this pause (broker), or the next run is already queued
    kind = RunKind.RETRY if task.waiting_for == WaitingFor.HUMAN else RunKind.RESUME
    return runs.create_run(task, kind, resume=task.resume)

"""Approvals and human-inbox questions: opening them when a run pauses, and deciding them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from approvals.models import Approval, Question, QuestionKind, QuestionState
from tasks.events import record_event
from tasks.models import EventKind

if TYPE_CHECKING:
    from tasks.models import Run, Task
    from tasks.workers.base import Paused


def open_blockers_for_pause(task: Task, run: Run, outcome: Paused) -> None:
    """Call inside the transaction that moved ``task`` to waiting.

    Creates the approval the pause asks for (bound to the task's new version), opens the
    questions the run staged, and turns missing inputs into one input question.
    """
    from tasks.facts import redactor_for

    redact = redactor_for(task)
    if outcome.approval is not None:
        spec = outcome.approval
        approval = Approval.objects.create(
            task=task,
            kind=spec["kind"],
            summary=redact.text(spec["summary"])[:500],
            detail=redact.redact(spec.get("detail", {})),
            guard=spec.get("guard", {}),
            amount_cents=spec.get("amount_cents", 0),
            task_version=task.version,
        )
        record_event(task, EventKind.APPROVAL, f"approval needed: {approval.summary}",
                     {"approval": approval.pk, "kind": approval.kind, "amount_cents": approval.amount_cents}, redactor=redact)
    if outcome.fields:
        question = Question.objects.create(
            task=task, run=run, kind=QuestionKind.INPUT, prompt=outcome.message, fields=outcome.fields,
            state=QuestionState.STAGED,
        )
        del question
    if outcome.waiting_for == "human":
        Question.objects.create(task=task, run=run, kind=QuestionKind.HUMAN, prompt=outcome.message, state=QuestionState.STAGED)
    opened = Question.objects.filter(task=task, state=QuestionState.STAGED)
    for question in opened:
        record_event(task, EventKind.QUESTION, f"question: {question.prompt}",
                     {"question": question.pk, "kind": question.kind, "fields": question.fields}, redactor=redact)
    opened.update(state=QuestionState.OPEN, task_version=task.version, created_at=timezone.now())


# --- Added by the broker work (issue 6) for pauses a live process waits on (`box approve`,
# --- irreversible or over-budget tool calls, `box ask`, `box need-human`). The approvals owner may
# --- fold these into their own functions; the broker only needs these two signatures.

def request_approval(
    task: Task,
    kind: str,
    summary: str,
    detail: dict[str, Any] | None = None,
    guard: dict[str, Any] | None = None,
    amount_cents: int = 0,
) -> Approval:
    """Open a pending approval for ``task`` and log it.

    Call inside the transaction that moved ``task`` to waiting/approval, so the approval is bound
    to the task's new version. ``guard`` names exactly what the OK allows; ``guard["held_run"]``
    means a live process waits on the decision in that run's broker: deciding must not queue a
    new run (the broker sees the decision, moves the task back to running and goes on; a new run
    would be closed at once by ``tasks.finalize.begin_run``). ``amount_cents`` is, for spending
    approvals, how much more budget the call asks for.
    """
    from tasks.facts import redactor_for

    redact = redactor_for(task)
    approval = Approval.objects.create(
        task=task, kind=kind, summary=redact.text(summary)[:500], detail=redact.redact(detail or {}),
        guard=guard or {}, amount_cents=amount_cents, task_version=task.version,
    )
    record_event(task, EventKind.APPROVAL, f"approval needed: {approval.summary}",
                 {"approval": approval.pk, "kind": kind, "amount_cents": amount_cents}, redactor=redact)
    return approval


def open_question(task: Task, run: Run | None, kind: str, prompt: str, fields: list[dict[str, Any]] | None = None) -> Question:
    """Open a human-inbox question at once (not staged) and log it.

    Call inside the transaction that moved ``task`` to waiting, for a pause a live process waits on.
    """
    from tasks.facts import redactor_for

    redact = redactor_for(task)
    question = Question.objects.create(
        task=task, run=run, kind=kind, prompt=redact.text(prompt)[:500], fields=fields or [],
        state=QuestionState.OPEN, task_version=task.version,
    )
    record_event(task, EventKind.QUESTION, f"question: {question.prompt}",
                 {"question": question.pk, "kind": kind, "fields": question.fields}, redactor=redact)
    return question

"""Approvals and human-inbox questions: opening them when a run pauses, and deciding them."""
from __future__ import annotations

from typing import TYPE_CHECKING

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

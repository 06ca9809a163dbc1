"""How approvals and questions look to callers (camelCase, like ``tasks.api.presenters``).

Their text was redacted when stored; it passes the task's redaction function again on the way
out, because a fact may have become secret since (an input that turned out to be a card number).
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from django.db.models import QuerySet

from approvals.models import (
    Action,
    ActionKind,
    ActionState,
    Approval,
    ApprovalKind,
    ApprovalState,
    Question,
    QuestionKind,
    QuestionState,
    Reconciliation,
)
from boxsite.core.shapes import DateTime, Doc
from tasks.api.presenters import InputField, Section, add_section
from tasks.models import EventKind, Task, TaskEvent
from tasks.states import State, WaitingFor
from tasks.vault.facts import Redactor, redactor_for

Screenshot = Annotated[str | None, Doc("the task's latest page image (an artifact URL), if any")]


class TaskSummary(TypedDict):
    id: str
    title: str
    state: Annotated[str, State]
    waitingFor: Annotated[str, WaitingFor] | None
    version: int


class ApprovalView(TypedDict):
    id: int
    task: str
    kind: Annotated[str, ApprovalKind]
    summary: str
    detail: dict[str, Any]
    guard: Annotated[dict[str, Any], Doc("the exact step or action this approves")]
    amountCents: int
    taskVersion: int
    state: Annotated[str, ApprovalState]
    decidedBy: str | None
    decidedVia: str | None
    decidedAt: DateTime | None
    createdAt: DateTime
    next: list[Literal["approve", "deny"]]
    screenshot: Screenshot
    taskView: NotRequired[TaskSummary]


class QuestionView(TypedDict):
    id: int
    task: str
    kind: Annotated[str, QuestionKind]
    prompt: str
    fields: Annotated[list[InputField], Doc("the values asked for")]
    answer: Any
    state: Annotated[str, QuestionState]
    taskVersion: int
    answeredBy: str | None
    answeredVia: str | None
    answeredAt: DateTime | None
    createdAt: DateTime
    next: list[Literal["answer"]]
    screenshot: Screenshot
    taskView: NotRequired[TaskSummary]


class Inbox(TypedDict):
    approvals: list[ApprovalView]
    questions: list[QuestionView]


class ActionReconciliation(TypedDict):
    answer: Annotated[str, Reconciliation]
    by: str | None
    at: DateTime | None


class ActionPolicy(TypedDict):
    """what let an action through, as it stood when proposed (``approvals.actions.policy_of``)"""

    approval: Annotated[str, Doc("whose OK it needs: the owner's, or not needed (the task allows destructive steps)")]
    allowDestructive: bool
    hosts: list[str]
    budgetCents: int
    tool: NotRequired[Annotated[str, Doc("a tool's action: the tool")]]
    costCents: NotRequired[Annotated[int, Doc("a tool's action: what one call of it costs")]]


class ActionView(TypedDict):
    id: int
    kind: Annotated[str, ActionKind, Doc("tool (an irreversible tool) or http (an http step with stop_before)")]
    target: Annotated[str, Doc("the tool's name, or the request's method and URL (redacted)")]
    position: Annotated[str, Doc("where it stands in the task: step:N in a flow, call for a process's call")]
    args: Annotated[dict[str, Any], Doc("the call's arguments, redacted")]
    idempotencyKey: Annotated[str, Doc("the same task, position and arguments give the same key")]
    state: Annotated[str, ActionState]
    taskVersion: Annotated[int, Doc("the task's version when it was proposed")]
    policy: ActionPolicy
    run: Annotated[int | None, Doc("the number of the run that proposed or attempted it")]
    approval: int | None
    attemptedAt: DateTime | None
    settledAt: DateTime | None
    receipt: Annotated[dict[str, Any] | None, Doc("a confirmed outcome: status, size, digest, an excerpt (redacted)")]
    error: str | None
    reconciliation: Annotated[ActionReconciliation | None, Doc("the owner's word on an unknown outcome")]
    createdAt: DateTime


class ActionPage(TypedDict):
    results: list[ActionView]
    next: str | None

SCREENSHOT_LOOKBACK = 20  # step results searched for the page a blocker is about


def latest_screenshot(task_id: str, until: datetime) -> str | None:
    """The URL of the last page image the task stored by ``until`` (the after-image of its
    latest browser step, or any image it saved): what a person sees on the card before acting."""
    events = TaskEvent.objects.filter(task_id=task_id, kind=EventKind.STEP_RESULT, created_at__lte=until).order_by("-seq")
    for artifacts in events.values_list("artifacts", flat=True)[:SCREENSHOT_LOOKBACK]:
        images = [a for a in artifacts or [] if str(a.get("type", "")).startswith("image/")]
        if images:
            after = [a for a in images if str(a.get("name", "")).endswith("-after.png")]
            return str((after or images)[-1]["url"])
    return None


def _task_summary(task: Any) -> TaskSummary:
    return {"id": task.pk, "title": task.title, "state": task.state, "waitingFor": task.waiting_for or None,
            "version": task.version}


def present_approval(approval: Approval, redact: Redactor | None = None, *, with_task: bool = False) -> ApprovalView:
    redact = redact or redactor_for(approval.task)
    body: ApprovalView = {
        "id": approval.pk,
        "task": approval.task_id,
        "kind": approval.kind,
        "summary": approval.summary,
        "detail": approval.detail,
        "guard": approval.guard,
        "amountCents": approval.amount_cents,
        "taskVersion": approval.task_version,
        "state": approval.state,
        "decidedBy": approval.decided_by.get_username() if approval.decided_by is not None else None,
        "decidedVia": approval.decided_via or None,
        "decidedAt": approval.decided_at.isoformat() if approval.decided_at else None,
        "createdAt": approval.created_at.isoformat(),
        "next": ["approve", "deny"] if approval.state == ApprovalState.PENDING else [],
        "screenshot": latest_screenshot(approval.task_id, approval.created_at),
    }
    if with_task:
        body["taskView"] = _task_summary(approval.task)
    return redact.redact(body)


def present_question(question: Question, redact: Redactor | None = None, *, with_task: bool = False) -> QuestionView:
    redact = redact or redactor_for(question.task)
    body: QuestionView = {
        "id": question.pk,
        "task": question.task_id,
        "kind": question.kind,
        "prompt": question.prompt,
        "fields": question.fields,
        "answer": question.answer,
        "state": question.state,
        "taskVersion": question.task_version,
        "answeredBy": question.answered_by.get_username() if question.answered_by is not None else None,
        "answeredVia": question.answered_via or None,
        "answeredAt": question.answered_at.isoformat() if question.answered_at else None,
        "createdAt": question.created_at.isoformat(),
        "next": ["answer"] if question.state == QuestionState.OPEN else [],
        "screenshot": latest_screenshot(question.task_id, question.created_at),
    }
    if with_task:
        body["taskView"] = _task_summary(question.task)
    return redact.redact(body)


def present_action(action: Action, redact: Redactor) -> ActionView:
    """One consequential action as the owner sees it: never its lease token."""
    reconciliation: ActionReconciliation | None = None
    if action.reconciliation:
        by = action.reconciled_by
        reconciliation = {"answer": action.reconciliation, "by": by.get_username() if by is not None else None,
                          "at": action.reconciled_at.isoformat() if action.reconciled_at else None}
    view: ActionView = {
        "id": action.pk,
        "kind": action.kind,
        "target": action.tool,
        "position": action.position,
        "args": action.args,
        "idempotencyKey": action.idempotency_key,
        "state": action.state,
        "taskVersion": action.task_version,
        "policy": action.policy,
        "run": action.run.number if action.run is not None else None,
        "approval": action.approval_id,
        "attemptedAt": action.attempted_at.isoformat() if action.attempted_at else None,
        "settledAt": action.settled_at.isoformat() if action.settled_at else None,
        "receipt": action.receipt,
        "error": action.error or None,
        "reconciliation": reconciliation,
        "createdAt": action.created_at.isoformat(),
    }
    return redact.redact(view)


# --- a task's approvals and questions, in its view and its report (tasks.api.presenters) ----------

def add_task_sections() -> None:
    """Called once by ``ApprovalsConfig.ready``: tasks shows what this app presents, unimported."""
    add_section("approvals", Section(
        detail=lambda task: [present_approval(a) for a in task.approvals.order_by("created_at")],
        report=lambda task, redact: [present_approval(a, redact) for a in task.approvals.order_by("pk")],
    ))
    add_section("questions", Section(
        detail=lambda task: [present_question(q) for q in _shown_questions(task).order_by("created_at")],
        report=lambda task, redact: [present_question(q, redact) for q in _shown_questions(task).order_by("pk")],
    ))


def _shown_questions(task: Task) -> QuerySet[Question]:
    """A staged question is not shown until its run ends waiting."""
    return task.questions.exclude(state=QuestionState.STAGED)

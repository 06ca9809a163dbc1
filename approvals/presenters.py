from __future__ import annotations

from typing import Any

from approvals.models import Approval, Question


def present_approval(approval: Approval) -> dict[str, Any]:
    return {
        "id": approval.pk,
        "task": approval.task_id,
        "kind": approval.kind,
        "summary": approval.summary,
        "detail": approval.detail,
        "guard": approval.guard,
        "amountCents": approval.amount_cents,
        "taskVersion": approval.task_version,
        "state": approval.state,
        "decidedBy": approval.decided_by.get_username() if approval.decided_by_id else None,
        "decidedVia": approval.decided_via or None,
        "decidedAt": approval.decided_at.isoformat() if approval.decided_at else None,
        "createdAt": approval.created_at.isoformat(),
    }


def present_question(question: Question) -> dict[str, Any]:
    return {
        "id": question.pk,
        "task": question.task_id,
        "kind": question.kind,
        "prompt": question.prompt,
        "fields": question.fields,
        "state": question.state,
        "taskVersion": question.task_version,
        "answeredVia": question.answered_via or None,
        "answeredAt": question.answered_at.isoformat() if question.answered_at else None,
        "createdAt": question.created_at.isoformat(),
    }

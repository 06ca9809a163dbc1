"""Context every portal page shares, given by Django to each template it renders, so page views
neither pass it along nor import it from one another."""
from __future__ import annotations

from django.http import HttpRequest

from approvals.models import Approval, ApprovalState, Question, QuestionState


def inbox_count(request: HttpRequest) -> dict[str, int]:
    """How many approvals and questions wait for the signed-in owner: the count beside "Inbox"."""
    user = request.user
    if not user.is_authenticated:
        return {}
    approvals = Approval.objects.filter(task__owner=user, state=ApprovalState.PENDING).count()
    questions = Question.objects.filter(task__owner=user, state=QuestionState.OPEN).count()
    return {"inbox_count": approvals + questions}

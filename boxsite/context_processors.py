"""Context every portal page shares, given by Django to each template it renders, so page views
neither pass it along nor import it from one another."""
from __future__ import annotations

from django.http import HttpRequest

from approvals.models import Approval, ApprovalState, Question, QuestionState
from boxsite.core.principal import Principal
from tasks.models import Task


def inbox_count(request: HttpRequest) -> dict[str, int]:
    """How many approvals and questions wait for the signed-in owner: the count beside "Inbox"."""
    user = request.user
    if not user.is_authenticated:
        return {}
    tasks = Task.objects.inbox_of(Principal.session(user))
    approvals = Approval.objects.filter(task__in=tasks, state=ApprovalState.PENDING).count()
    questions = Question.objects.filter(task__in=tasks, state=QuestionState.OPEN).count()
    return {"inbox_count": approvals + questions}

"""The approvals and inbox API. Each view: check input, call one service, present the result."""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from approvals import services
from approvals.models import Action
from approvals.presenters import ActionPage, ApprovalView, Inbox, QuestionView, present_action, present_approval, present_question
from approvals.services import AnswerBody, ContinueBody, DecideBody, continue_task
from boxsite.core.pagination import Sort, limit_param, page
from boxsite.core.principal import Principal
from boxsite.core.shapes import shape
from tasks.api.presenters import TaskView, present_task
from tasks.services import get_task_for
from tasks.vault.facts import Redactor, redactor_for

ACTION_SORTS = {
    "-created": Sort("-created", "created_at", descending=True),
    "created": Sort("created", "created_at", descending=False),
    "-attempted": Sort("-attempted", "attempted_at", descending=True, nullable=True),
    "attempted": Sort("attempted", "attempted_at", descending=False, nullable=True),
}


@extend_schema(responses={200: shape(Inbox)})
@api_view(["GET"])
def inbox(request: Request) -> Response:
    """Every pending approval and open question across the caller's tasks, oldest first."""
    approvals, questions = services.inbox_for(Principal.of(request))
    redactors: dict[str, Redactor] = {}

    def redact(task: Any) -> Redactor:
        if task.pk not in redactors:
            redactors[task.pk] = redactor_for(task)
        return redactors[task.pk]

    body: Inbox = {
        "approvals": [present_approval(a, redact(a.task), with_task=True) for a in approvals],
        "questions": [present_question(q, redact(q.task), with_task=True) for q in questions],
    }
    return Response(body)


@extend_schema(responses={200: shape(ApprovalView)})
@api_view(["GET"])
def approval_detail(request: Request, approval_id: str) -> Response:
    return Response(present_approval(services.get_approval_for(Principal.of(request), approval_id), with_task=True))


@extend_schema(request=None, responses={200: shape(ApprovalView)})
@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
def approval_link(request: Request, token: str) -> Response:
    """Use a signed approve or deny link from a phone's notification: it decides its one
    approval, once, with no session (the signature is the credential). A used link is
    LINK_USED, an old one LINK_EXPIRED, one the box did not sign NOT_FOUND."""
    return Response(present_approval(services.decide_by_link(token), with_task=True))


def _decide(request: Request, approval_id: str, approve: bool) -> Response:
    version = DecideBody.parse(request.data).get("version")
    approval = services.decide_approval(Principal.of(request), approval_id, approve=approve, expected_version=version)
    return Response(present_approval(approval, with_task=True))


@extend_schema(request=DecideBody, responses={200: shape(ApprovalView)})
@api_view(["POST"])
def approval_approve(request: Request, approval_id: str) -> Response:
    return _decide(request, approval_id, True)


@extend_schema(request=DecideBody, responses={200: shape(ApprovalView)})
@api_view(["POST"])
def approval_deny(request: Request, approval_id: str) -> Response:
    return _decide(request, approval_id, False)


@extend_schema(responses={200: shape(QuestionView)})
@api_view(["GET"])
def question_detail(request: Request, question_id: str) -> Response:
    return Response(present_question(services.get_question_for(Principal.of(request), question_id), with_task=True))


@extend_schema(request=AnswerBody, responses={200: shape(QuestionView)})
@api_view(["POST"])
def question_answer(request: Request, question_id: str) -> Response:
    question = services.answer_question(Principal.of(request), question_id, request.data)
    return Response(present_question(question, with_task=True))


@extend_schema(
    parameters=[
        OpenApiParameter("sort", str, description="-created (default), created, -attempted or attempted"),
        OpenApiParameter("cursor", str, description="from the previous page's 'next' (bound to its sort)"),
        OpenApiParameter("limit", int),
    ],
    responses={200: shape(ActionPage)},
)
@api_view(["GET"])
def task_actions(request: Request, task_id: str) -> Response:
    """The task's consequential actions: state, redacted arguments, receipts, reconciliations."""
    task = get_task_for(Principal.of(request), task_id)
    rows, next_cursor = page(Action.objects.filter(task=task).select_related("run", "reconciled_by"), ACTION_SORTS,
                             request.query_params.get("sort", "-created"), request.query_params.get("cursor"),
                             limit_param(request.query_params.get("limit")))
    redact = redactor_for(task)
    listed: ActionPage = {"results": [present_action(a, redact) for a in rows], "next": next_cursor}
    return Response(listed)


@extend_schema(request=ContinueBody, responses={200: shape(TaskView)})
@api_view(["POST"])
def task_continue(request: Request, task_id: str) -> Response:
    """Answer what a waiting task asked for: inputs, an approval decision, or a person's OK."""

    return Response(present_task(continue_task(Principal.of(request), task_id, request.data)))

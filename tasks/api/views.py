"""The task API. Each view: check input, call one service, present the result."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.http import FileResponse
from django.http.response import HttpResponseBase
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core import idempotency
from boxsite.core.errors import InvalidRequest
from boxsite.core.negotiation import answers_any_type
from boxsite.core.pagination import Sort, limit_param, page
from boxsite.core.principal import Principal, Via
from boxsite.core.shapes import shape
from tasks import dependencies, services, verbs
from tasks.api.presenters import (
    ApprovalViews,
    EventPage,
    QuestionViews,
    RunPage,
    TaskPage,
    TaskView,
    detail_sections,
    present_event,
    present_run,
    present_task,
)
from tasks.api.report import Report, build_report
from tasks.machines import calls, homes
from tasks.models import Run, Task, TaskEvent
from tasks.run import artifacts
from tasks.spec.task import RerunBody, RetryBody, TaskSpecBody
from tasks.states import State
from tasks.vault.facts import redactor_for

TASK_SORTS = {
    "-created": Sort("-created", "created_at", descending=True),
    "created": Sort("created", "created_at", descending=False),
    "-updated": Sort("-updated", "updated_at", descending=True),
}
EVENT_PAGE = 200
RUN_SORTS = {
    "-number": Sort("-number", "number", descending=True),
    "number": Sort("number", "number", descending=False),
    "-started": Sort("-started", "started_at", descending=True, nullable=True),
    "started": Sort("started", "started_at", descending=False, nullable=True),
}



class TaskDetail(TaskView):
    approvals: ApprovalViews
    questions: QuestionViews
    log: EventPage


class DependencyBody(serializers.Serializer[Any]):
    """``POST /api/tasks/<id>/dependencies``, as declared in the schema (``services.add_dependency``
    checks it)."""

    task = serializers.CharField(help_text="the task to wait for")
    condition = serializers.ChoiceField(choices=["success", "completion", "artifact"], required=False, default="success")
    required = serializers.BooleanField(required=False, default=True)  # type: ignore[assignment]  # a body field
    artifact = serializers.CharField(required=False, help_text="for 'artifact': the file under outputs/ the dependency must leave")


@extend_schema(
    methods=["GET"], operation_id="tasks_list",
    parameters=[
        OpenApiParameter("state", str, description="filter by state"),
        OpenApiParameter("source", str, description="filter by source"),
        OpenApiParameter("q", str, description="search: every word in the title or the prompt (case-insensitive)"),
        OpenApiParameter("sort", str, description="-created (default), created or -updated"),
        OpenApiParameter("cursor", str, description="from the previous page's 'next'"),
        OpenApiParameter("limit", int),
    ],
    responses={200: shape(TaskPage)},
)
@extend_schema(methods=["POST"], request=TaskSpecBody, parameters=idempotency.PARAMETERS,
               responses={201: shape(TaskView), 409: idempotency.REUSED})
@api_view(["GET", "POST"])
def task_list(request: Request) -> Response:
    principal = Principal.of(request)
    if request.method == "POST":
        created = idempotency.create_once(
            request, principal, "POST /api/tasks",
            lambda: services.create_task(request.data, principal, source=channel_source(principal, request.data)),
            ident=lambda task: task.pk, find=lambda pk: Task.objects.filter(pk=pk).first())
        return idempotency.answer(present_task(created.value), created)
    return Response(task_page(principal, request.query_params))


def task_page(principal: Principal, params: Mapping[str, Any]) -> TaskPage:
    """The tasks ``principal`` may see, filtered and paged by ``params`` (the query of
    ``GET /api/tasks``: state, source, q, sort, cursor, limit)."""
    qs = Task.objects.listed_for(principal).select_related("workspace")
    state = params.get("state")
    if state:
        states = state.split(",")
        bad = [s for s in states if s not in State.values]
        if bad:
            raise InvalidRequest(f"unknown state '{bad[0]}'", field="state")
        qs = qs.filter(state__in=states)
    source = params.get("source")
    if source:
        qs = qs.filter(source=source)
    words = (params.get("q") or "").strip()
    if len(words) > 200:
        raise InvalidRequest("'q' is longer than 200 characters", field="q")
    for word in words.split():  # every word, in the title or the prompt
        qs = qs.filter(Q(title__icontains=word) | Q(prompt__icontains=word))
    rows, next_cursor = page(qs, TASK_SORTS, params.get("sort", "-created"),
                             params.get("cursor"), limit_param(params.get("limit")))
    listed: TaskPage = {"results": [present_task(t) for t in rows], "next": next_cursor}
    return listed


def channel_source(principal: Principal, body: Any) -> str | None:
    """``source`` for a task made through the box's own pages: the phone, or the portal (a signed-in
    session that names no source of its own). None lets the spec's ``source`` (or "api") stand."""
    if principal.via == Via.DEVICE:
        return "phone"
    if principal.via == Via.SESSION and not (isinstance(body, dict) and "source" in body):
        return "portal"
    return None


def events_after(task: Task, after: int, limit: int, *, upto: int | None = None) -> EventPage:
    """Events with seq > ``after`` (at most ``limit``; with ``upto``, none past that seq)."""

    redact = redactor_for(task)
    rows = TaskEvent.objects.filter(task=task, seq__gt=after)
    if upto is not None:
        rows = rows.filter(seq__lte=upto)
    events = list(rows.order_by("seq")[: limit + 1])
    more = len(events) > limit
    events = events[:limit]
    return {
        "events": [redact.redact(present_event(e)) for e in events],
        "after": after,
        "nextAfter": events[-1].seq if events else after,
        "more": more,
    }


def _after_param(request: Request) -> int:
    raw = request.query_params.get("after", "0")
    try:
        after = int(raw)
    except ValueError as exc:
        raise InvalidRequest("'after' must be a whole number (a seq)", field="after") from exc
    if after < 0:
        raise InvalidRequest("'after' must not be negative", field="after")
    return after


@extend_schema(parameters=[OpenApiParameter("after", int)], responses={200: shape(TaskDetail)})
@api_view(["GET"])
def task_detail(request: Request, task_id: str) -> Response:
    task = services.get_task_for(Principal.of(request), task_id)
    sections = detail_sections(task)  # the approvals and questions (approvals.presenters)
    body: TaskDetail = {
        **present_task(task),
        "approvals": sections.get("approvals", []),
        "questions": sections.get("questions", []),
        # The log page stops at the task's own lastSeq: the view and its log are one snapshot, so a
        # client that follows live from lastSeq gets every later event together with a fresh view
        # (events written between the two reads would otherwise arrive without the state they set).
        "log": events_after(task, _after_param(request), EVENT_PAGE, upto=task.event_seq),
    }
    return Response(body)


@extend_schema(parameters=[OpenApiParameter("after", int), OpenApiParameter("limit", int)], responses={200: shape(EventPage)})
@api_view(["GET"])
def task_events(request: Request, task_id: str) -> Response:
    task = services.get_task_for(Principal.of(request), task_id)
    return Response(events_after(task, _after_param(request), limit_param(request.query_params.get("limit"), EVENT_PAGE, 1000)))


@extend_schema(request=None, responses={200: shape(TaskView)})
@api_view(["POST"])
def task_cancel(request: Request, task_id: str) -> Response:
    return Response(present_task(verbs.cancel_task(Principal.of(request), task_id)))


@extend_schema(request=None, responses={200: shape(TaskView)})
@api_view(["POST"])
def task_undo(request: Request, task_id: str) -> Response:
    return Response(present_task(verbs.undo_task(Principal.of(request), task_id)))


@extend_schema(request=RerunBody, responses={201: shape(TaskView)})
@api_view(["POST"])
def task_rerun(request: Request, task_id: str) -> Response:
    """A new task from this ended task's spec; the body's fields replace the spec's."""
    principal = Principal.of(request)
    task = verbs.rerun_task(principal, task_id, request.data, source=channel_source(principal, request.data))
    return Response(present_task(task), status=201)


@extend_schema(request=RetryBody, responses={200: shape(TaskView)})
@api_view(["POST"])
def task_retry(request: Request, task_id: str) -> Response:
    """Retry a recoverably failed task in place, from the step that failed; the body may raise
    its limits and budget first (never lower them)."""
    return Response(present_task(verbs.retry_task(Principal.of(request), task_id, request.data)))


@extend_schema(responses={200: shape(Report)})
@api_view(["GET"])
def task_report(request: Request, task_id: str) -> Response:
    """Everything the task did: its view, flow, steps reached, records and rescues; redacted."""

    return Response(build_report(services.get_task_for(Principal.of(request), task_id)))


@extend_schema(responses={(200, "application/octet-stream"): bytes})
@api_view(["GET"])
@answers_any_type
def task_artifact(request: Request, task_id: str, name: str) -> HttpResponseBase:
    """A file a step carried (listed on its event's ``artifacts``), under the task's access rule."""
    task = services.get_task_for(Principal.of(request), task_id)
    holder = homes.holder_of(task) if settings.BOX_MACHINE else ""
    if homes.away(holder):  # its artifacts are on the disk of the machine that ran it
        return calls.relay(holder, request)
    return artifact_response(task, name)


def artifact_response(task: Task, name: str) -> FileResponse:
    """The artifact's bytes, read on this machine."""
    path = artifacts.artifact_file(task.pk, name)
    response = FileResponse(path.open("rb"), content_type=artifacts.content_type(name))
    if response["Content-Type"].startswith("text/"):
        response["Content-Type"] += "; charset=utf-8"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"  # never a page of the box's origin
    return response


@extend_schema(methods=["GET"], responses={200: shape(dependencies.DependencyGraph)})
@extend_schema(methods=["POST"], request=DependencyBody, responses={201: shape(dependencies.DependencyGraph)})
@api_view(["GET", "POST"])
def task_dependencies(request: Request, task_id: str) -> Response:
    """The task's dependencies and dependents; POST adds an edge to a task that has not started."""
    principal = Principal.of(request)
    if request.method == "POST":
        task = verbs.add_dependency(principal, task_id, request.data)
        return Response(dependencies.graph(task), status=201)
    return Response(dependencies.graph(services.get_task_for(principal, task_id)))


@extend_schema(
    parameters=[
        OpenApiParameter("sort", str, description="-number (default), number, -started or started"),
        OpenApiParameter("cursor", str, description="from the previous page's 'next' (bound to its sort)"),
        OpenApiParameter("limit", int),
    ],
    responses={200: shape(RunPage)},
)
@api_view(["GET"])
def task_runs(request: Request, task_id: str) -> Response:
    """The task's attempts, public history: mode, state, outcome, error, usage, timestamps."""
    task = services.get_task_for(Principal.of(request), task_id)
    rows, next_cursor = page(Run.objects.filter(task=task), RUN_SORTS, request.query_params.get("sort", "-number"),
                             request.query_params.get("cursor"), limit_param(request.query_params.get("limit")))
    redact = redactor_for(task)
    started = Run.objects.filter(task=task, started_at__isnull=False)
    listed: RunPage = {
        "results": [present_run(r, redact) for r in rows], "next": next_cursor,
        "attempts": {"total": started.count(), "charged": started.filter(charged=True).count()},
    }
    return Response(listed)

"""The schedule and trigger API, and the public webhook endpoint.

Each API view: check input, call one service, present the result. The webhook endpoint is a
plain Django view: it needs the raw body bytes, has no session or CSRF (the signature is its
only authentication), and answers in the box's error shape.
"""
from __future__ import annotations

from django.conf import settings
from django.db.models import Q, QuerySet
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core import idempotency
from boxsite.core.errors import BoxError, InvalidRequest, PayloadTooLarge
from boxsite.core.pagination import Sort, limit_param, page
from boxsite.core.principal import Principal
from boxsite.core.shapes import shape
from schedules import services, triggers, webhooks
from schedules.models import Origin, Schedule, ScheduleStatus, Trigger, TriggerKind
from schedules.presenters import (
    DeliveryList,
    FiringList,
    SchedulePage,
    ScheduleView,
    TriggerPage,
    TriggerView,
    WebhookReceived,
    present_delivery,
    present_firing,
    present_schedule,
    present_trigger,
)
from tasks.api.presenters import TaskView, present_task

SCHEDULE_SORTS = {
    "next": Sort("next", "next_run_at", descending=False, nullable=True),
    "-next": Sort("-next", "next_run_at", descending=True, nullable=True),
    "last": Sort("last", "last_run_at", descending=False, nullable=True),
    "-last": Sort("-last", "last_run_at", descending=True, nullable=True),
    "name": Sort("name", "name", descending=False),
    "-created": Sort("-created", "created_at", descending=True),
}
TRIGGER_SORTS = {
    "-created": Sort("-created", "created_at", descending=True),
    "name": Sort("name", "name", descending=False),
    "-fired": Sort("-fired", "last_fired_at", descending=True, nullable=True),
}
STATUS_FILTERS = {
    ScheduleStatus.ACTIVE: Q(enabled=True, paused=False, needs_attention=False),
    ScheduleStatus.PAUSED: Q(enabled=True, paused=True),
    ScheduleStatus.DISABLED: Q(enabled=False),
    ScheduleStatus.ATTENTION: Q(enabled=True, paused=False, needs_attention=True),
}


def _choices(request: Request, name: str, allowed: list[str]) -> list[str]:
    raw = request.query_params.get(name)
    if not raw:
        return []
    values = raw.split(",")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise InvalidRequest(f"unknown {name} '{bad[0]}' (one of {', '.join(allowed)})", field=name)
    return values


def _bool_param(request: Request, name: str) -> bool | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise InvalidRequest(f"'{name}' must be true or false", field=name)


def _filtered_schedules(request: Request) -> QuerySet[Schedule]:
    qs = Schedule.objects.filter(owner=Principal.of(request).user)
    statuses = _choices(request, "status", list(ScheduleStatus.values))
    if statuses:
        condition = Q(pk__in=[])
        for status in statuses:
            condition |= STATUS_FILTERS[ScheduleStatus(status)]
        qs = qs.filter(condition)
    origins = _choices(request, "origin", list(Origin.values))
    if origins:
        qs = qs.filter(created_via__in=origins)
    enabled = _bool_param(request, "enabled")
    if enabled is not None:
        qs = qs.filter(enabled=enabled)
    return qs


@extend_schema(
    methods=["GET"], operation_id="schedules_list",
    parameters=[
        OpenApiParameter("status", str, description="active, paused, disabled, attention (comma-separated)"),
        OpenApiParameter("origin", str, description="owner, device, task, system (comma-separated)"),
        OpenApiParameter("enabled", bool),
        OpenApiParameter("sort", str, description=", ".join(SCHEDULE_SORTS) + " (default next)"),
        OpenApiParameter("cursor", str, description="from the previous page's 'next'"),
        OpenApiParameter("limit", int),
    ],
    responses={200: shape(SchedulePage)},
)
@extend_schema(methods=["POST"], request=services.ScheduleBody, parameters=idempotency.PARAMETERS,
               responses={201: shape(ScheduleView), 409: idempotency.REUSED})
@api_view(["GET", "POST"])
def schedule_list(request: Request) -> Response:
    principal = Principal.of(request)
    if request.method == "POST":
        created = idempotency.create_once(
            request, principal, "POST /api/schedules", lambda: services.create_schedule(principal, request.data),
            ident=lambda schedule: str(schedule.pk),
            find=lambda pk: Schedule.objects.filter(pk=pk, owner=principal.user).first())
        return idempotency.answer(present_schedule(created.value), created)
    rows, next_cursor = page(_filtered_schedules(request), SCHEDULE_SORTS, request.query_params.get("sort", "next"),
                             request.query_params.get("cursor"), limit_param(request.query_params.get("limit")))
    listed: SchedulePage = {"results": [present_schedule(s) for s in rows], "next": next_cursor}
    return Response(listed)


@extend_schema(methods=["PATCH"], request=services.ScheduleChangeBody, responses={200: shape(ScheduleView)})
@extend_schema(methods=["GET", "DELETE"], responses={200: shape(ScheduleView), 204: None})
@api_view(["GET", "PATCH", "DELETE"])
def schedule_detail(request: Request, schedule_id: str) -> Response:
    principal = Principal.of(request)
    if request.method == "PATCH":
        schedule = services.update_schedule(principal, schedule_id, request.data)
    elif request.method == "DELETE":
        services.delete_schedule(principal, schedule_id)
        return Response(status=204)
    else:
        schedule = services.get_schedule_for(principal, schedule_id)
    return Response(present_schedule(schedule, last_firing=schedule.firings.order_by("-id").first()))


@extend_schema(request=None, responses={201: shape(TaskView)})
@api_view(["POST"])
def schedule_run(request: Request, schedule_id: str) -> Response:
    """Run now: the schedule's task starts at once; its own timetable is unchanged."""
    return Response(present_task(services.run_schedule_now(Principal.of(request), schedule_id)), status=201)


@extend_schema(request=None, responses={200: shape(ScheduleView)})
@api_view(["POST"])
def schedule_pause(request: Request, schedule_id: str) -> Response:
    return Response(present_schedule(services.pause_schedule(Principal.of(request), schedule_id)))


@extend_schema(request=None, responses={200: shape(ScheduleView)})
@api_view(["POST"])
def schedule_resume(request: Request, schedule_id: str) -> Response:
    return Response(present_schedule(services.resume_schedule(Principal.of(request), schedule_id)))


@extend_schema(parameters=[OpenApiParameter("limit", int)], responses={200: shape(FiringList)})
@api_view(["GET"])
def schedule_firings(request: Request, schedule_id: str) -> Response:
    schedule = services.get_schedule_for(Principal.of(request), schedule_id)
    limit = limit_param(request.query_params.get("limit"), 50, 200)
    listed: FiringList = {"results": [present_firing(f) for f in schedule.firings.select_related("task").order_by("-id")[:limit]]}
    return Response(listed)


def _trigger_view(request: Request, trigger: Trigger, *, secret: str | None = None) -> TriggerView:
    view = present_trigger(trigger, secret=secret)
    if trigger.kind == TriggerKind.WEBHOOK:
        view["url"] = request.build_absolute_uri(view["path"])
    return view


@extend_schema(
    methods=["GET"], operation_id="triggers_list",
    parameters=[
        OpenApiParameter("kind", str, description="webhook or file"),
        OpenApiParameter("paused", bool),
        OpenApiParameter("sort", str, description=", ".join(TRIGGER_SORTS)),
        OpenApiParameter("cursor", str),
        OpenApiParameter("limit", int),
    ],
    responses={200: shape(TriggerPage)},
)
@extend_schema(methods=["POST"], request=triggers.TriggerBody, parameters=idempotency.PARAMETERS,
               responses={201: shape(TriggerView), 409: idempotency.REUSED})
@api_view(["GET", "POST"])
def trigger_list(request: Request) -> Response:
    principal = Principal.of(request)
    if request.method == "POST":
        created = idempotency.create_once(
            request, principal, "POST /api/triggers", lambda: triggers.create_trigger(principal, request.data),
            ident=lambda made: str(made[0].pk), find=lambda pk: triggers.created_trigger(principal, pk))
        trigger, secret = created.value
        return idempotency.answer(_trigger_view(request, trigger, secret=secret), created)
    qs = Trigger.objects.filter(owner=principal.user)
    kinds = _choices(request, "kind", list(TriggerKind.values))
    if kinds:
        qs = qs.filter(kind__in=kinds)
    paused = _bool_param(request, "paused")
    if paused is not None:
        qs = qs.filter(paused=paused)
    rows, next_cursor = page(qs, TRIGGER_SORTS, request.query_params.get("sort", "-created"),
                             request.query_params.get("cursor"), limit_param(request.query_params.get("limit")))
    listed: TriggerPage = {"results": [_trigger_view(request, t) for t in rows], "next": next_cursor}
    return Response(listed)


@extend_schema(methods=["PATCH"], request=triggers.TriggerChangeBody, responses={200: shape(TriggerView)})
@extend_schema(methods=["GET", "DELETE"], responses={200: shape(TriggerView), 204: None})
@api_view(["GET", "PATCH", "DELETE"])
def trigger_detail(request: Request, trigger_id: str) -> Response:
    principal = Principal.of(request)
    if request.method == "PATCH":
        trigger = triggers.update_trigger(principal, trigger_id, request.data)
    elif request.method == "DELETE":
        triggers.delete_trigger(principal, trigger_id)
        return Response(status=204)
    else:
        trigger = triggers.get_trigger_for(principal, trigger_id)
    return Response(_trigger_view(request, trigger))


@extend_schema(request=None, responses={200: shape(TriggerView)})
@api_view(["POST"])
def trigger_pause(request: Request, trigger_id: str) -> Response:
    return Response(_trigger_view(request, triggers.set_trigger_paused(Principal.of(request), trigger_id, True)))


@extend_schema(request=None, responses={200: shape(TriggerView)})
@api_view(["POST"])
def trigger_resume(request: Request, trigger_id: str) -> Response:
    return Response(_trigger_view(request, triggers.set_trigger_paused(Principal.of(request), trigger_id, False)))


@extend_schema(request=dict, responses={202: shape(WebhookReceived)})
@api_view(["POST"])
def trigger_test(request: Request, trigger_id: str) -> Response:
    """A test delivery to this webhook, signed and received like a real one (it starts a task)."""
    received = webhooks.send_test_delivery(Principal.of(request), trigger_id, request.data)
    body: WebhookReceived = {"task": received.task_id, "delivery": received.delivery_id or None,
                             "duplicate": received.duplicate}
    return Response(body, status=202)


@extend_schema(request=triggers.RotateBody, responses={200: shape(TriggerView)})
@api_view(["POST"])
def trigger_rotate(request: Request, trigger_id: str) -> Response:
    trigger, secret = triggers.rotate_secret(Principal.of(request), trigger_id, request.data)
    return Response(_trigger_view(request, trigger, secret=secret))


@extend_schema(request=None, responses={200: shape(TriggerView)})
@api_view(["POST"])
def trigger_finish_rotation(request: Request, trigger_id: str) -> Response:
    return Response(_trigger_view(request, triggers.finish_rotation(Principal.of(request), trigger_id)))


@extend_schema(parameters=[OpenApiParameter("limit", int)], responses={200: shape(DeliveryList)})
@api_view(["GET"])
def trigger_deliveries(request: Request, trigger_id: str) -> Response:
    """The webhook's recent deliveries, newest first (those with a delivery id; see webhooks)."""
    trigger = triggers.get_trigger_for(Principal.of(request), trigger_id)
    limit = limit_param(request.query_params.get("limit"), 50, 200)
    rows = trigger.deliveries.select_related("task").order_by("-received_at", "-id")[:limit]
    listed: DeliveryList = {"results": [present_delivery(d) for d in rows]}
    return Response(listed)


def _read_body(request: HttpRequest) -> bytes:
    """The raw body, refusing more than ``BOX_WEBHOOK_MAX_BYTES`` before reading it all."""
    limit = settings.BOX_WEBHOOK_MAX_BYTES
    too_large = PayloadTooLarge(f"the body is larger than {limit} bytes", field="body")
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError as exc:
        raise InvalidRequest("Content-Length is not a number", field="body") from exc
    if declared > limit:
        raise too_large
    body = request.read(limit + 1)
    if len(body) > limit:
        raise too_large
    return body


@csrf_exempt
@require_POST
def webhook(request: HttpRequest, token: str) -> JsonResponse:
    """POST /hooks/<token>: 202 and the task started; 200 for a delivery already seen."""
    try:
        received = webhooks.receive(token, request.headers, _read_body(request), request.content_type or "")
    except BoxError as exc:
        return JsonResponse(exc.as_dict(), status=exc.status)
    body: WebhookReceived = {"task": received.task_id, "delivery": received.delivery_id or None,
                             "duplicate": received.duplicate}
    return JsonResponse(body, status=200 if received.duplicate else 202)

from __future__ import annotations

import logging
import secrets
import sys
from typing import Annotated, Any, Literal, TypedDict

from django.conf import settings
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from boxsite.core import sql
from boxsite.core.beats import Liveness, liveness
from boxsite.core.errors import BUSY_RETRY_AFTER_S, busy_body, database_busy
from boxsite.core.middleware import is_api_path
from boxsite.core.shapes import Doc, shape
from tasks.sandbox.isolation import IsolationView, describe_isolation

log = logging.getLogger("boxsite.core.errors")


class Health(TypedDict):
    ok: bool
    database: Literal["postgresql", "sqlite"]
    queue: Literal["redis", "orm"]
    live: Literal["redis", "polling"]
    isolation: Annotated[IsolationView, Doc("what isolation is in force")]
    worker: Annotated[Liveness, Doc("the worker cluster's heartbeat: alive, stale (older than BOX_BEAT_STALE_S) "
                                    "or never seen")]
    scheduler: Annotated[Liveness, Doc("the scheduler's heartbeat, the same way")]


@extend_schema(responses={200: shape(Health)})
@api_view(["GET"])
@permission_classes([AllowAny])
def health(request: Request) -> Response:
    """Liveness (of this process, the database, the worker and the scheduler) and what isolation is
    in force (never pretends)."""

    sql.ping()

    body: Health = {
        "ok": True,
        "database": "postgresql" if settings.DB_IS_POSTGRES else "sqlite",
        "queue": "redis" if settings.REDIS_URL else "orm",
        "live": "redis" if settings.REDIS_URL else "polling",
        "isolation": describe_isolation(),
        "worker": liveness("worker"),
        "scheduler": liveness("scheduler"),
    }
    return Response(body)


def _error(code: str, message: str, status: int, **extra: Any) -> JsonResponse:
    return JsonResponse({"code": code, "message": message, "field": None, **extra}, status=status)


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for every path: JSON in the API's error shape under /api/ and /hooks/, a page elsewhere."""
    if is_api_path(request.path):
        return _error("NOT_FOUND", f"no such API endpoint: {request.method} {request.path}", 404)
    return defaults.page_not_found(request, exception or Http404())


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request.path):
        return _error("INVALID_REQUEST", "the request is malformed", 400)
    return defaults.bad_request(request, exception or SuspiciousOperation())


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if is_api_path(request.path):
        return _error("FORBIDDEN", "not allowed", 403)
    return defaults.permission_denied(request, exception or PermissionDenied())


def server_error(request: HttpRequest) -> HttpResponse:
    """An unexpected error: logged with a reference id that the caller gets too."""
    if database_busy(sys.exc_info()[1] or Exception()):
        # Raised outside an API view (a middleware, a page): the same answer the API gives.
        log.warning("database busy: %s %s answered 503", request.method, request.path)
        busy: HttpResponse
        if is_api_path(request.path):
            busy = JsonResponse(busy_body(), status=503)
        else:
            busy = HttpResponse(busy_body()["message"], status=503, content_type="text/plain; charset=utf-8")
        busy["Retry-After"] = str(BUSY_RETRY_AFTER_S)
        return busy
    reference = secrets.token_hex(6)
    log.error("unexpected error, reference %s: %s %s", reference, request.method, request.path, exc_info=sys.exc_info())
    if is_api_path(request.path):
        return _error("SERVER_ERROR", f"something went wrong on the box; the log has the details under reference {reference}",
                      500, reference=reference)
    return defaults.server_error(request)

"""The API's edge: what is refused before any view runs, in the API's error shape.

On ``/api/``, ``/hooks/`` and ``/mcp`` paths a request whose path or query holds a NUL character (which
PostgreSQL cannot compare or store) is ``400``, and one that declares a body over the limit is
``413`` before a byte of it is read. On the pages a NUL there is Django's 400 page. A cookie
holding a NUL (no browser is sent one, and the session's lookup of it fails on PostgreSQL) is
dropped before the session, CSRF and device checks read it, on every path. Unknown paths and unexpected errors there are answered by
``boxsite.views.api_not_found`` / ``server_error`` (see ``boxsite.urls``). Every request is one
``boxsite.core.reads`` scope.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from boxsite.core import reads
from boxsite.core.errors import BoxError, InvalidRequest, PayloadTooLarge

API_PREFIXES = ("/api/", "/hooks/")
UPLOAD_PATH = re.compile(r"^/api/workspaces/[^/]+/files/.")


def is_api_path(path: str) -> bool:
    return path.startswith(API_PREFIXES) or path in ("/api", "/hooks", "/mcp", "/mcp/")


def body_limit_for(path: str) -> int:
    if UPLOAD_PATH.match(path):
        return int(settings.BOX_UPLOAD_MAX_MB) * 1024 * 1024  # a file, not a JSON body
    return settings.BOX_WEBHOOK_MAX_BYTES if path.startswith("/hooks/") else settings.BOX_API_MAX_BYTES


def _check_text(request: HttpRequest) -> None:
    if "\x00" in request.path:
        raise InvalidRequest("the path must not contain NUL characters", field="path")
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in v for v in values):
            raise InvalidRequest("query parameters must not contain NUL characters", field=name.replace("\x00", "") or None)


def _check(request: HttpRequest) -> None:
    _check_text(request)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError as exc:
        raise InvalidRequest("Content-Length is not a number", field="body") from exc
    limit = body_limit_for(request.path)
    if declared > limit:
        raise PayloadTooLarge(f"the body is larger than {limit} bytes", field="body")


class ApiEdgeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for name in [name for name, value in request.COOKIES.items() if "\x00" in name + value]:
            del request.COOKIES[name]
        if is_api_path(request.path):
            try:
                _check(request)
            except BoxError as exc:
                return JsonResponse(exc.as_dict(), status=exc.status)
        else:
            try:
                _check_text(request)
            except BoxError as exc:
                return defaults.bad_request(request, SuspiciousOperation(exc.message))
        with reads.read_once():  # the settings row and the vault read once per request
            return self.get_response(request)

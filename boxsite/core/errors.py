"""Domain errors and the one place they become the API's error shape.

Every error the API returns is ``{"code": ..., "message": ..., "field": ...}`` (``ErrorBody``).
Services raise ``BoxError`` subclasses; DRF's own exceptions (auth, parse, 404) are mapped onto
the same shape.
"""
from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict

from django.db import OperationalError
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response

from boxsite.core.cards import mask_cards
from boxsite.core.shapes import Doc, leave_open


class ErrorBody(TypedDict):
    """an error, in the API's one error shape; some codes add context (a conflict's current state)"""

    code: Annotated[str, Doc("stable error code, e.g. INVALID_SPEC, NOT_FOUND, CONFLICT")]
    message: str
    field: Annotated[str | None, Doc("the request field at fault, dotted, or null")]
    reference: NotRequired[Annotated[str, Doc("500 only: the id the box's log has the details under")]]


leave_open(ErrorBody)


class BoxError(Exception):
    code = "INVALID_REQUEST"
    status = 400

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code:
            self.code = code
        self.extra = extra

    def as_dict(self) -> ErrorBody:
        body: ErrorBody = {"code": self.code, "message": mask_cards(self.message), "field": self.field}
        body.update(self.extra)  # type: ignore[typeddict-item]  # the code's own context, beside the shape
        return body


class InvalidSpec(BoxError):
    code = "INVALID_SPEC"


class InvalidFlow(BoxError):
    code = "INVALID_FLOW"


class InvalidRequest(BoxError):
    code = "INVALID_REQUEST"


class NotAvailable(BoxError):
    """A field the box will take once what it promises exists (refused, never stored and ignored)."""

    code = "NOT_AVAILABLE"


class InvalidOutput(BoxError):
    code = "INVALID_OUTPUT"


class OutputUnavailable(BoxError):
    code = "OUTPUT_UNAVAILABLE"


class OriginsRequired(BoxError):
    code = "ORIGINS_REQUIRED"


class TooManyTasks(BoxError):
    code = "TOO_MANY_TASKS"
    status = 429


class NotFound(BoxError):
    code = "NOT_FOUND"
    status = 404


class Conflict(BoxError):
    code = "CONFLICT"
    status = 409


class StaleApproval(BoxError):
    code = "STALE_APPROVAL"
    status = 409


class PayloadTooLarge(BoxError):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class Forbidden(BoxError):
    code = "FORBIDDEN"
    status = 403


_DRF_CODES = {
    drf.NotAuthenticated: "UNAUTHENTICATED",
    drf.AuthenticationFailed: "UNAUTHENTICATED",
    drf.PermissionDenied: "FORBIDDEN",
    drf.NotFound: "NOT_FOUND",
    drf.MethodNotAllowed: "METHOD_NOT_ALLOWED",
    drf.ParseError: "INVALID_REQUEST",
    drf.UnsupportedMediaType: "UNSUPPORTED_MEDIA_TYPE",
    drf.Throttled: "THROTTLED",
}


def _first_validation_error(detail: Any, path: str = "") -> tuple[str | None, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            sub = f"{path}.{key}" if path else str(key)
            return _first_validation_error(value, "" if key == "non_field_errors" else sub)
    if isinstance(detail, list) and detail:
        return _first_validation_error(detail[0], path)
    return (path or None), str(detail)


# What the database says when a request could not get it within its limit: SQLite's lock (or the
# box's writer gate before it), PostgreSQL's lock or statement timeout.
_BUSY_SIGNS = ("database is locked", "database table is locked", "lock timeout", "statement timeout")
BUSY_RETRY_AFTER_S = 5


def database_busy(exc: BaseException) -> bool:
    """True when ``exc`` is the database refusing for now (held by another connection or process
    past the wait's limit), which a retry later fixes: not the box's fault, and no 500."""
    return isinstance(exc, OperationalError) and any(sign in str(exc).lower() for sign in _BUSY_SIGNS)


def busy_body() -> ErrorBody:
    return {"code": "DATABASE_BUSY", "field": None,
            "message": f"the box's database is held by another process; nothing was changed. Try again in "
                       f"{BUSY_RETRY_AFTER_S} seconds (Retry-After)"}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if database_busy(exc):
        return Response(busy_body(), status=503, headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
    if isinstance(exc, BoxError):
        return Response(exc.as_dict(), status=exc.status)
    if isinstance(exc, Http404):
        return Response({"code": "NOT_FOUND", "message": "not found", "field": None}, status=404)
    if isinstance(exc, drf.ValidationError):
        field, message = _first_validation_error(exc.detail)
        return Response({"code": "INVALID_REQUEST", "message": message, "field": field}, status=400)
    if isinstance(exc, drf.APIException):
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "ERROR")
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        out = Response({"code": code, "message": str(detail), "field": None}, status=exc.status_code)
        # The headers DRF's own handler would set (rest_framework.views is not imported here:
        # it reads the parser settings at import, and the parser raises these errors).
        auth_header = getattr(exc, "auth_header", None)
        if auth_header:
            out["WWW-Authenticate"] = auth_header
        wait = getattr(exc, "wait", None)
        if wait:
            out["Retry-After"] = str(int(wait))
        return out
    return None

"""The broker's wire format: one JSON object per line, one reply per request.

A request is ``{"id": <any>, "op": <name>, ...arguments}``. A reply is
``{"id": <same>, "ok": true, "result": ...}`` or
``{"id": <same>, "ok": false, "error": {"code": ..., "message": ..., "field": ...}}``.
The ``box`` client (``tasks/broker/client/box``) speaks this with nothing but the standard
library, so the shapes here stay plain on purpose.
"""
from __future__ import annotations

import json
from typing import Any

from boxsite.core.errors import BoxError

MAX_LINE = 1024 * 1024  # a request larger than this is refused, not buffered without bound

OPS = frozenset({"ping", "step", "tool", "ask", "approve", "spend", "need_human", "task", "schedule"})


class CallError(BoxError):
    """A broker call that cannot be served; the client prints ``message`` and exits non-zero."""

    code = "BAD_REQUEST"


class ToolRefused(CallError):
    code = "TOOL_REFUSED"


class InvalidArgs(CallError):
    code = "INVALID_ARGS"


class ToolFailed(CallError):
    code = "TOOL_FAILED"


class Denied(CallError):
    code = "DENIED"


class NotAllowed(CallError):
    """The owner's policy does not allow it (``tasks.tools.delegation``)."""

    code = "NOT_ALLOWED"


class TaskEnded(CallError):
    code = "TASK_ENDED"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise CallError(f"not a JSON line: {exc}") from exc
    if not isinstance(message, dict):
        raise CallError("a request is a JSON object")
    op = message.get("op")
    if op not in OPS:
        raise CallError(f"unknown op {op!r}; the broker knows {', '.join(sorted(OPS))}", field="op")
    return message


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), default=str).encode() + b"\n"


def reply_ok(request_id: Any, result: Any) -> dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def reply_error(request_id: Any, error: BoxError) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": {"code": error.code, "message": error.message, "field": error.field}}


def text_arg(message: dict[str, Any], key: str, *, required: bool = True, max_len: int = 10_000) -> str:
    value = message.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise CallError(f"'{key}' must be a non-empty string", field=key)
    if len(value) > max_len:
        raise CallError(f"'{key}' is longer than {max_len} characters", field=key)
    return value

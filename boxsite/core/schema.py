"""The glue between the API's declarations and ``/api/schema/``.

Response bodies are declared once, as ``TypedDict``s beside the presenters that build them (see
``boxsite.core.shapes``); request bodies are declared where they are checked, as
``boxsite.core.validation.Body`` serializers. This module adds what drf-spectacular cannot know: the
response shapes as components, the error responses of every operation, and the two ways a caller
authenticates. ``tests/api/test_schema.py`` holds the schema to the URL map, and
``tests/schema_check.py`` to every JSON answer the API gives the test suite.
"""
from __future__ import annotations

import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from boxsite.core import shapes
from boxsite.core.errors import ErrorBody


class BearerAuth(OpenApiAuthenticationExtension):
    target_class = "boxsite.core.auth.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}


class DeviceCookieAuth(OpenApiAuthenticationExtension):
    target_class = "boxsite.core.auth.DeviceCookieAuthentication"
    name = "device"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "box_device"}


ERRORS = {
    "400": "the request is invalid: a body, a field, a query parameter or the path (field names it)",
    "401": "no credentials, or unknown or revoked ones",
    "403": "the caller may not do this (a paired phone's limits, a token without the right, a cookie's change "
           "without the CSRF token)",
    "404": "no such thing for this caller",
    "406": "the Accept header names no type the box answers in (JSON)",
    "409": "the thing is not in a state that allows this now (a conflict, a stale approval)",
    "413": "the body is larger than the box takes",
    "415": "the body is not JSON",
    "429": "too many tasks are queued, running or waiting",
    "500": "something went wrong on the box; reference names the log entry",
    "503": "the database is busy (held by another process past the request's limit); Retry-After says when to try again",
}
# Operations that start a task (or queue one again) beyond those answering 201 with one: each
# is refused with 429 at the box's maximum of active tasks.
STARTS_TASK = {("post", "/api/triggers/{trigger_id}/test"), ("post", "/api/tasks/{task_id}/retry")}
# GETs that can meet a conflict: a file that changes while it is read.
READ_CONFLICTS = {("get", "/api/workspaces/{name}/files"), ("get", "/api/workspaces/{name}/files/{path}")}
# GETs a signed-in caller may be refused (403): what only the owner's browser or tokens read, not
# a paired phone. Every other change can answer 403 too: cookie credentials need the CSRF token.
# ``tests/api/test_schema.py`` asks each signed-in GET as a phone and holds this list to the answers.
OWNER_READS = {("get", "/api/settings"), ("get", "/api/settings/model"), ("get", "/api/vault"),
               ("get", "/api/tokens"), ("get", "/api/devices"), ("get", "/api/browser/cache")}


def errors_of(path: str, method: str, operation: dict[str, Any]) -> list[str]:
    """The error statuses an operation can answer, from what it takes and what it does. Any
    request can be malformed (a NUL in its path or query is refused at the edge) or ask for a
    type the box does not answer in."""
    signed_in = {} not in operation.get("security", [{}])
    has_body = "requestBody" in operation
    # Only a JSON body goes through the parser that refuses another type; a raw body takes any.
    json_body = "application/json" in operation.get("requestBody", {}).get("content", {})
    in_path = bool(re.search(r"\{\w+\}", path))
    creates_task = (method == "post" and "TaskView" in str(operation.get("responses", {}).get("201", ""))) \
        or (method, path) in STARTS_TASK
    codes = ["400"]
    if signed_in:
        codes.append("401")
        if method != "get" or (method, path) in OWNER_READS:
            codes.append("403")
    if in_path:
        codes.append("404")
    codes.append("406")
    if method != "get" or (method, path) in READ_CONFLICTS:
        codes.append("409")
    if has_body:
        codes.append("413")
    if json_body:
        codes.append("415")
    if creates_task:
        codes.append("429")
    return codes + ["500", "503"]


def add_shapes_and_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Add the response shapes as components, and to every operation the errors it can answer,
    each in the one error shape."""
    error = shapes.shape(ErrorBody)
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in shapes.components().items():
        if name in schemas:
            raise ValueError(f"the response shape {name} has the name of a request body's component")
        schemas[name] = schema
    for path, path_item in result.get("paths", {}).items():
        for method, operation in path_item.items():
            responses = operation.setdefault("responses", {})
            for code in errors_of(path, method, operation):
                responses.setdefault(code, {"description": ERRORS[code],
                                            "content": {"application/json": {"schema": error}}})
    return result

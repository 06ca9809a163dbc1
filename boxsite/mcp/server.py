"""The MCP transport: Streamable HTTP, each JSON-RPC message POSTed to ``/mcp`` and answered in
the response's body as ``application/json``.

The server keeps no session and opens no event stream (a GET is 405, as the specification allows):
every request stands on its own, authenticated by its bearer token, so any web process of the box
answers it and nothing is lost on a restart. Nothing the box does needs the server to speak first;
a client follows long work by polling ``get_task``.

A tool's failure (a bad spec, a missing task, a task in the wrong state) is the tool's answer,
``isError`` with the API's error body, so the calling model reads it; a malformed message is a
JSON-RPC error carrying the same body as its ``data``.
"""
from __future__ import annotations

import json
from typing import IO, Any, cast

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.utils.encoders import JSONEncoder

from boxsite.core.auth import BearerTokenOrDeviceAuthentication
from boxsite.core.errors import BoxError, exception_handler
from boxsite.core.parsers import BoxJSONParser
from boxsite.core.principal import Principal
from boxsite.mcp import tools

# Handshake protocol versions, newest first: the newest is offered unless the client asks for another.
VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
SERVER = {"name": "box", "title": "The box", "version": "1"}
INSTRUCTIONS = (
    "The box runs tasks in a sandbox: an agent given a prompt, or a flow of steps. create_task answers at once "
    "with the task's id; poll get_task until 'final' is true. A task that waits ('state': 'waiting') asks for "
    "something: answer it with continue_task. Errors come back as {code, message, field}."
)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


class RpcError(Exception):
    def __init__(self, code: int, message: str, *, data: Any = None, status: int = 200) -> None:
        super().__init__(message)
        self.code, self.message, self.data, self.status = code, message, data, status


@csrf_exempt
def endpoint(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        refused = _api_error(drf.MethodNotAllowed(request.method or ""))
        refused["Allow"] = "POST"
        return refused
    try:
        found = BearerTokenOrDeviceAuthentication().authenticate(request)
        if found is None:
            raise drf.NotAuthenticated()
    except drf.APIException as exc:
        return _api_error(exc)
    principal = Principal.of_credential(*found)
    message: Any = None
    try:
        version = request.headers.get("MCP-Protocol-Version")
        if version is not None and version not in VERSIONS:
            raise RpcError(INVALID_REQUEST, f"unsupported MCP-Protocol-Version '{version}' (this server speaks "
                           f"{', '.join(VERSIONS)})", status=400)
        message = _message(request)
        if "method" not in message or "id" not in message:
            return HttpResponse(status=202)  # a notification, or a client's answer: nothing to say back
        result = _answer(principal, message["method"], message.get("params"))
    except RpcError as error:
        body: dict[str, Any] = {"code": error.code, "message": error.message}
        if error.data is not None:
            body["data"] = error.data
        return _rpc({"jsonrpc": "2.0", "id": _id_of(message), "error": body}, status=error.status)
    return _rpc({"jsonrpc": "2.0", "id": message["id"], "result": result})


def _message(request: HttpRequest) -> dict[str, Any]:
    """The one JSON-RPC message of the body (the box's JSON limits apply: size, depth, text)."""
    try:
        message = BoxJSONParser().parse(cast(IO[bytes], request))  # the request reads as its body's stream
    except BoxError as exc:
        raise RpcError(PARSE_ERROR, exc.message, data=exc.as_dict(), status=exc.status) from None
    if isinstance(message, list):
        raise RpcError(INVALID_REQUEST, "send one JSON-RPC message per request (batches are not taken)", status=400)
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 message", status=400)
    if "id" in message and (isinstance(message["id"], bool) or not isinstance(message["id"], (str, int))):
        raise RpcError(INVALID_REQUEST, "'id' must be a string or a whole number", status=400)
    if "method" in message and not isinstance(message["method"], str):
        raise RpcError(INVALID_REQUEST, "'method' must be a string", status=400)
    return message


def _id_of(message: Any) -> Any:
    if isinstance(message, dict) and isinstance(message.get("id"), (str, int)) and not isinstance(message["id"], bool):
        return message["id"]
    return None


def _answer(principal: Principal, method: str, params: Any) -> dict[str, Any]:
    if params is not None and not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "'params' must be an object")
    params = params or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {"protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
                "capabilities": {"tools": {"listChanged": False}}, "serverInfo": SERVER, "instructions": INSTRUCTIONS}
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": [tool.listed() for tool in tools.TOOLS.values()]}
    if method == "tools/call":
        name = params.get("name")
        if not isinstance(name, str) or name not in tools.TOOLS:
            raise RpcError(INVALID_PARAMS, f"unknown tool {name!r}; tools/list names them")
        return _call(principal, name, params.get("arguments"))
    raise RpcError(METHOD_NOT_FOUND, f"this server does not answer '{method}'")


def _call(principal: Principal, name: str, arguments: Any) -> dict[str, Any]:
    try:
        result: Any = tools.call(principal, name, arguments)
        failed = False
    except (BoxError, Http404, drf.APIException) as exc:  # what the API answers in its shape; else a 500
        shaped = exception_handler(exc, {})
        assert shaped is not None
        result, failed = shaped.data, True
    text = json.dumps(result, cls=JSONEncoder, ensure_ascii=False)
    answer: dict[str, Any] = {"content": [{"type": "text", "text": text}], "structuredContent": json.loads(text)}
    if failed:
        answer["isError"] = True
    return answer


def _api_error(exc: drf.APIException) -> JsonResponse:
    """An HTTP-level refusal (no token, a wrong method), in the API's error shape."""
    shaped = exception_handler(exc, {})
    assert shaped is not None
    response = JsonResponse(shaped.data, status=shaped.status_code)
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        response["WWW-Authenticate"] = BearerTokenOrDeviceAuthentication.keyword
    return response


def _rpc(body: dict[str, Any], *, status: int = 200) -> JsonResponse:
    return JsonResponse(body, status=status, encoder=JSONEncoder, json_dumps_params={"ensure_ascii": False})


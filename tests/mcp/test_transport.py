"""The transport's edges, in process: every message gets an answer in the protocol's shape (or
the API's, before the protocol starts), never a 500."""
from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests.conftest import Box


def post(box: Box, body: Any, **headers: str) -> Any:
    raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return Client().post("/mcp", raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {box.token}",
                         **headers)


def rpc(method: str, params: Any = None, id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def test_initialize_answers_the_version_asked_for_when_it_is_spoken_else_the_newest(box: Box) -> None:
    for asked, answered in (("2025-06-18", "2025-06-18"), ("2024-11-05", "2025-11-25"), ("later", "2025-11-25")):
        result = post(box, rpc("initialize", {"protocolVersion": asked, "capabilities": {},
                                              "clientInfo": {"name": "t", "version": "1"}})).json()["result"]
        assert result["protocolVersion"] == answered
        assert result["capabilities"] == {"tools": {"listChanged": False}} and result["serverInfo"]["name"] == "box"


def test_notifications_and_a_clients_answers_are_accepted_without_a_body(box: Box) -> None:
    for message in ({"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "id": 7, "result": {}}):
        response = post(box, message)
        assert (response.status_code, response.content) == (202, b"")


@pytest.mark.parametrize(("body", "code", "status"), [
    ("{not json", -32700, 400),
    ('{"jsonrpc": "2.0", "id": 1, "method": "ping", "x": "\\u0000"}', -32700, 400),
    ([rpc("ping"), rpc("ping", id=2)], -32600, 400),
    ({"id": 1, "method": "ping"}, -32600, 400),
    ({"jsonrpc": "2.0", "id": True, "method": "ping"}, -32600, 400),
    (rpc("resources/list"), -32601, 200),
    (rpc("tools/call", {"name": "rm_rf"}), -32602, 200),
    (rpc("tools/call", ["get_task"]), -32602, 200),
])
def test_a_malformed_message_is_a_json_rpc_error(box: Box, body: Any, code: int, status: int) -> None:
    response = post(box, body)
    assert response.status_code == status
    assert response.json()["jsonrpc"] == "2.0" and response.json()["error"]["code"] == code


def test_an_unspoken_protocol_version_header_is_refused(box: Box) -> None:
    response = post(box, rpc("ping"), HTTP_MCP_PROTOCOL_VERSION="1999-01-01")
    assert response.status_code == 400 and response.json()["error"]["code"] == -32600
    assert post(box, rpc("ping"), HTTP_MCP_PROTOCOL_VERSION="2025-06-18").json() == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_arguments_that_are_not_an_object_are_the_tools_error(box: Box) -> None:
    for name, arguments in (("get_task", ["tk1"]), ("get_task", {"task": 5}), ("list_tasks", {"limit": "9"}),
                            ("create_task", "do it"), ("list_files", {"workspace": "home", "depth": 2})):
        result = post(box, rpc("tools/call", {"name": name, "arguments": arguments})).json()["result"]
        assert result["isError"] is True, (name, arguments)
        assert result["structuredContent"]["code"] in ("INVALID_REQUEST", "INVALID_SPEC")
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]


def test_only_post_is_served(box: Box) -> None:
    for method in ("get", "delete", "put"):
        response = getattr(Client(), method)("/mcp", HTTP_AUTHORIZATION=f"Bearer {box.token}")
        assert response.status_code == 405 and response["Allow"] == "POST"
        assert response.json()["code"] == "METHOD_NOT_ALLOWED"


def test_every_tool_declares_an_object_schema_of_its_arguments(box: Box) -> None:
    tools = post(box, rpc("tools/list")).json()["result"]["tools"]
    for tool in tools:
        assert tool["inputSchema"]["type"] == "object" and tool["description"], tool["name"]
    spec = next(t for t in tools if t["name"] == "create_task")["inputSchema"]
    assert {"title", "prompt", "flow", "workspace", "budgetCents"} <= set(spec["properties"])
    assert "oneOf" in json.dumps(spec["properties"]["flow"])  # the flow language, a schema per step kind

"""The box through MCP, driven by the official SDK's client over Streamable HTTP: a program that
speaks only MCP starts a task, follows it to its end, approves a step, and meets the API's access
rules (no token, a paired phone's limits)."""
from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from rest_framework.test import APIClient

from tests.factories import flow
from tests.live_box import LiveBox
from tests.portal.conftest import pair_device

WRITES = flow({"write": {"path": "hello.txt", "content": "hello from mcp"}})
WAITS_FOR_AN_OK = flow({"approve": "go on?"}, {"write": {"path": "done.txt", "content": "ok"}})
TOOLS = {"create_task", "get_task", "list_tasks", "read_log", "get_diff", "continue_task", "cancel_task",
         "undo_task", "keep_task", "list_workspaces", "list_files"}


def over_mcp(box: LiveBox, token: str | None, work: Callable[[ClientSession], Awaitable[Any]]) -> Any:
    """Run ``work`` in an initialized MCP session with ``token`` (none: no Authorization header)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def session() -> Any:
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http, \
                streamable_http_client(box.mcp, http_client=http) as (read, write), \
                ClientSession(read, write) as client:
            await client.initialize()
            return await work(client)

    return anyio.run(session)


async def call(client: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.structured_content
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    return dict(result.structured_content)


async def refused(client: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return dict(result.structured_content)


async def until(client: ClientSession, task_id: str, *states: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view = await call(client, "get_task", task=task_id)
        if view["state"] in states:
            return view
        assert time.monotonic() < deadline, f"task {task_id} is {view['state']}, not {states}"
        await anyio.sleep(0.1)


def test_a_client_lists_the_tools_and_runs_a_flow_to_its_end(live_box: LiveBox) -> None:
    async def work(client: ClientSession) -> None:
        await client.send_ping()
        listed = await client.list_tools()
        assert {tool.name for tool in listed.tools} == TOOLS
        create = next(tool for tool in listed.tools if tool.name == "create_task")
        assert "flow" in create.input_schema["properties"]

        made = await call(client, "create_task", title="say hello", flow=WRITES)
        assert made["state"] in ("queued", "running") and made["source"] == "mcp"
        done = await until(client, made["id"], "done", "failed")
        assert done["state"] == "done", done["error"]
        assert done["approvals"] == [] and done["final"] is True

        log = await call(client, "read_log", task=made["id"])
        assert any(event["kind"] == "status" for event in log["events"])
        diff = await call(client, "get_diff", task=made["id"])
        assert "hello.txt" in json.dumps(diff)
        listed_tasks = await call(client, "list_tasks", state="done")
        assert [t["id"] for t in listed_tasks["results"]] == [made["id"]]
        file = await call(client, "list_files", workspace="home", path="hello.txt")
        assert "hello from mcp" in json.dumps(file)
        assert [w["name"] for w in (await call(client, "list_workspaces"))["results"]] == ["home"]

        undone = await call(client, "undo_task", task=made["id"])
        assert undone["state"] == "undone"

    over_mcp(live_box, live_box.token, work)


def test_a_client_approves_a_waiting_task(live_box: LiveBox) -> None:
    async def work(client: ClientSession) -> None:
        made = await call(client, "create_task", title="asks first", flow=WAITS_FOR_AN_OK)
        waiting = await until(client, made["id"], "waiting")
        assert waiting["waitingFor"] == "approval" and len(waiting["approvals"]) == 1
        continued = await call(client, "continue_task", task=made["id"], approve=True)
        assert continued["id"] == made["id"] and continued["version"] > waiting["version"]
        [approval] = (await until(client, made["id"], "done"))["approvals"]
        assert (approval["state"], approval["decidedVia"]) == ("approved", "api")

        other = await call(client, "create_task", title="asks too", flow=WAITS_FOR_AN_OK)
        await until(client, other["id"], "waiting")
        assert (await call(client, "cancel_task", task=other["id"]))["state"] == "cancelled"

    over_mcp(live_box, live_box.token, work)


def test_a_tools_failure_is_its_answer_in_the_apis_error_shape(live_box: LiveBox) -> None:
    async def work(client: ClientSession) -> None:
        bad = await refused(client, "create_task", title="no work given")
        assert bad["code"] == "INVALID_SPEC" and bad["field"] == "prompt"
        unknown = await refused(client, "create_task", title="x", prompt="y", colour="red")
        assert unknown["code"] == "INVALID_SPEC" and unknown["field"] == "colour"
        missing = await refused(client, "get_task", task="tk0nothere")
        assert missing == {"code": "NOT_FOUND", "message": "no task 'tk0nothere'", "field": None}
        assert (await refused(client, "read_log", task="tk0nothere", limit=0))["field"] == "limit"
        assert (await refused(client, "list_tasks", state="asleep"))["field"] == "state"
        with pytest.raises(MCPError):
            await client.call_tool("no_such_tool", {})
        assert (await call(client, "list_tasks"))["results"] == []

    over_mcp(live_box, live_box.token, work)


def test_without_a_token_the_box_answers_401(live_box: LiveBox) -> None:
    for headers in ({}, {"Authorization": "Bearer box_not-a-token"}):
        response = httpx2.post(live_box.mcp, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.json()["code"] == "UNAUTHENTICATED" and set(response.json()) == {"code", "message", "field"}
    with pytest.raises(BaseException) as raised:
        over_mcp(live_box, None, lambda client: client.send_ping())
    assert raised.group_contains(MCPError) if isinstance(raised.value, BaseExceptionGroup) else isinstance(raised.value, MCPError)


def test_a_paired_phone_reaches_only_what_it_reaches_in_the_api(live_box: LiveBox, tmp_path: Any) -> None:
    owner_api = APIClient()
    owner_api.credentials(HTTP_AUTHORIZATION=f"Bearer {live_box.token}")
    owners = owner_api.post("/api/tasks", {"title": "the owner's", "flow": WRITES}, format="json").json()["id"]
    device = pair_device(owner_api)
    folder = tmp_path / "folder"
    folder.mkdir()

    async def work(client: ClientSession) -> None:
        mine = await call(client, "create_task", title="from the phone", flow=WRITES)
        assert mine["source"] == "phone"
        assert [t["id"] for t in (await call(client, "list_tasks"))["results"]] == [mine["id"]]
        assert (await refused(client, "get_task", task=owners))["message"] == f"no task '{owners}'"
        assert (await refused(client, "cancel_task", task=owners))["code"] == "NOT_FOUND"
        on_folder = await refused(client, "create_task", title="on a folder", prompt="tidy", folder=str(folder))
        assert (on_folder["code"], on_folder["field"]) == ("FORBIDDEN", "folders"), on_folder

    over_mcp(live_box, device, work)
    # the owner's device token on the API itself stays a cookie: a bearer there is a token or nothing
    assert APIClient().get("/api/tasks", HTTP_AUTHORIZATION=f"Bearer {device}").status_code == 401


ASKS_A_COLOUR = flow({"ask": {"name": "colour", "why": "which colour"}},
                     {"write": {"path": "colour.txt", "content": "${colour}"}})


def test_a_client_denies_a_step_and_the_task_ends_without_it(live_box: LiveBox) -> None:
    async def work(client: ClientSession) -> None:
        made = await call(client, "create_task", title="asks first", flow=WAITS_FOR_AN_OK)
        await until(client, made["id"], "waiting")
        await call(client, "continue_task", task=made["id"], approve=False)
        ended = await until(client, made["id"], "failed", "done", "cancelled")
        assert ended["state"] == "cancelled" and ended["final"], ended["state"]
        [approval] = ended["approvals"]
        assert (approval["state"], approval["decidedVia"]) == ("denied", "api")
        assert (await refused(client, "list_files", workspace="home", path="done.txt"))["code"] == "NOT_FOUND"
        again = await refused(client, "continue_task", task=made["id"], approve=True)
        assert again["code"] == "CONFLICT", again

    over_mcp(live_box, live_box.token, work)


def test_a_client_answers_a_tasks_question_with_its_inputs(live_box: LiveBox) -> None:
    async def work(client: ClientSession) -> None:
        made = await call(client, "create_task", title="asks a value", flow=ASKS_A_COLOUR)
        waiting = await until(client, made["id"], "waiting")
        assert waiting["waitingFor"] == "input"
        [question] = waiting["questions"]
        assert [f["name"] for f in question["fields"]] == ["colour"] == [f["name"] for f in waiting["pause"]["fields"]]
        # A value is asked for: a note alone does not answer it, and says what does.
        wrong = await refused(client, "continue_task", task=made["id"], answer="red")
        assert wrong["field"] == "inputs", wrong
        await call(client, "continue_task", task=made["id"], inputs={"colour": "red"})
        done = await until(client, made["id"], "done", "failed")
        assert done["state"] == "done", done["error"]
        [answered] = done["questions"]
        assert (answered["id"], answered["state"], answered["answeredVia"]) == (question["id"], "answered", "api")
        file = await call(client, "list_files", workspace="home", path="colour.txt")
        assert file["content"] == "red", file

    over_mcp(live_box, live_box.token, work)


def test_a_client_keeps_a_folder_tasks_changes(live_box: LiveBox, tmp_path: Any) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "f.txt").write_text("old\n")

    async def work(client: ClientSession) -> None:
        made = await call(client, "create_task", title="edits a folder", folder=str(folder),
                          flow=flow({"write": {"path": "f.txt", "content": "new\n"}}))
        done = await until(client, made["id"], "done", "failed")
        assert done["state"] == "done", done["error"]
        assert done["review"] == "pending" and "keep" in done["next"]
        assert (folder / "f.txt").read_text() == "old\n"  # untouched until Keep
        kept = await call(client, "keep_task", task=made["id"])
        assert (kept["id"], kept["review"], kept["conflicts"]) == (made["id"], "kept", [])
        assert (folder / "f.txt").read_text() == "new\n"
        twice = await refused(client, "keep_task", task=made["id"])
        assert (twice["code"], twice["field"]) == ("CONFLICT", "review"), twice

        plain = await call(client, "create_task", title="no folder", flow=WRITES)
        await until(client, plain["id"], "done")
        not_folder = await refused(client, "keep_task", task=plain["id"])
        assert (not_folder["code"], not_folder["field"]) == ("CONFLICT", "review"), not_folder

    over_mcp(live_box, live_box.token, work)

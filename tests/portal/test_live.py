"""The live streams, through Channels' WebsocketCommunicator against the real ASGI application:
backlog then live, nothing lost across reconnects, and every refusal a stream must make."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from boxsite.core.auth import DEVICE_COOKIE, issue_api_token
from boxsite.models import ApiToken
from tasks.api import consumers
from tasks.api.consumers import SAFETY_POLL_S
from tasks.models import Task
from tasks.services import note
from tests.factories import flow, make_owner
from tests.portal.conftest import pair_device, session_cookie, ws

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.usefixtures("stream_connections_closed")]

WAITS_FOR_INPUT = flow({"write": {"path": "who.txt", "content": "${who}"}})


def sync(fn: Any) -> Any:
    return database_sync_to_async(fn)


def record_notes(task_id: str, count: int, prefix: str = "note") -> None:
    """Append events through the action log's one writer, as a worker's recorder does."""

    task = Task.objects.get(pk=task_id)
    for i in range(count):
        note(task, f"{prefix} {i}")


async def frames_until(client: WebsocketCommunicator, done: Any, *, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Collect frames until ``done(frames)`` holds; fails after ``timeout`` seconds."""
    frames: list[dict[str, Any]] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while not done(frames):
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AssertionError(f"timed out; got {frames}")
        frames.append(await client.receive_json_from(timeout=left))
    return frames


def seqs(frames: list[dict[str, Any]]) -> list[int]:
    return [f["event"]["seq"] for f in frames if f["type"] == "event"]


def is_ready(frames: list[dict[str, Any]]) -> bool:
    return bool(frames) and frames[-1]["type"] == "ready"


async def waiting_task(box: Any) -> str:
    task = await sync(box.create)(title="waits for a name", flow=WAITS_FOR_INPUT)
    await sync(box.wait_state)(task["id"], "waiting")
    return task["id"]


async def test_it_sends_the_backlog_then_live_events_in_seq_order(box: Any, transport: str) -> None:
    task_id = await waiting_task(box)
    logged = await sync(box.events)(task_id)
    client = ws(f"/ws/tasks/{task_id}/?after=0", session=await sync(session_cookie)(box.owner))
    connected, _ = await client.connect()
    assert connected
    backlog = await frames_until(client, is_ready)
    assert seqs(backlog) == [e["seq"] for e in logged]
    assert [f["event"]["summary"] for f in backlog if f["type"] == "event"] == [e["summary"] for e in logged]
    header = [f for f in backlog if f["type"] == "task"][-1]["task"]
    assert header["state"] == "waiting" and header["waitingFor"] == "input"

    await sync(record_notes)(task_id, 25)
    live = await frames_until(client, lambda fs: len(seqs(fs)) >= 25)
    assert seqs(live) == list(range(len(logged) + 1, len(logged) + 26))

    response = await sync(box.api.post)(f"/api/tasks/{task_id}/cancel")
    assert response.status_code == 200
    ended = await frames_until(client, lambda fs: any(f["type"] == "task" and f["task"]["state"] == "cancelled" for f in fs))
    assert [f["event"]["kind"] for f in ended if f["type"] == "event"][-1] == "status"
    await client.disconnect()


async def test_a_client_connecting_while_events_are_written_gets_each_seq_once_in_order(box: Any, transport: str) -> None:
    task_id = await waiting_task(box)
    session = await sync(session_cookie)(box.owner)
    first = (await sync(box.events)(task_id))[-1]["seq"]
    def burst() -> None:
        try:
            record_notes(task_id, 120, "burst")
        finally:
            connection.close()  # this thread's own connection

    writer = threading.Thread(target=burst)
    writer.start()
    client = ws(f"/ws/tasks/{task_id}/?after=0", session=session)
    assert (await client.connect())[0]
    frames = await frames_until(client, lambda fs: len(seqs(fs)) >= first + 120, timeout=30)
    await asyncio.get_running_loop().run_in_executor(None, writer.join)
    assert seqs(frames) == list(range(1, first + 121))
    await client.disconnect()


async def test_a_move_committed_while_the_stream_reads_is_shown_with_its_new_state(
        box: Any, transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream reads the task and its events in two statements. A move that commits between
    them must still end with a frame showing the state it moved to: the last frame of a task
    that failed is never a "running" one sent beside the failure's event."""
    task_id = await waiting_task(box)
    client = ws(f"/ws/tasks/{task_id}/?after=0", session=await sync(session_cookie)(box.owner))
    assert (await client.connect())[0]
    await frames_until(client, is_ready)

    read_task = consumers.get_task_for
    moved = threading.Event()

    def read_then_cancel(principal: Any, task_id_: str, **kwargs: Any) -> Task:
        task = read_task(principal, task_id_, **kwargs)
        if not moved.is_set():
            moved.set()  # the owner cancels right after the stream read the task
            assert box.api.post(f"/api/tasks/{task_id}/cancel").status_code == 200
        return task

    monkeypatch.setattr(consumers, "get_task_for", read_then_cancel)
    await sync(record_notes)(task_id, 1, "wakes the stream")

    def showed_cancelled(fs: list[dict[str, Any]]) -> bool:
        return any(f["type"] == "task" and f["task"]["state"] == "cancelled" for f in fs)

    # Read the other way round, the cancel's event would go out beside the task read before it,
    # and nothing would be left to send: the stream would show "waiting" for good.
    frames = await frames_until(client, showed_cancelled, timeout=SAFETY_POLL_S * 3 + 10)
    assert moved.is_set()
    assert any("cancelled by the owner" in f["event"]["summary"] for f in frames if f["type"] == "event")
    await client.disconnect()


async def test_a_client_reconnecting_after_its_last_seq_loses_nothing(box: Any, transport: str) -> None:
    task_id = await waiting_task(box)
    session = await sync(session_cookie)(box.owner)
    client = ws(f"/ws/tasks/{task_id}/", session=session)
    assert (await client.connect())[0]
    seen = seqs(await frames_until(client, is_ready))
    await sync(record_notes)(task_id, 5, "before the drop")
    seen += seqs(await frames_until(client, lambda fs: len(seqs(fs)) >= 5))
    await client.disconnect()

    await sync(record_notes)(task_id, 7, "while away")
    again = ws(f"/ws/tasks/{task_id}/?after={seen[-1]}", session=session)
    assert (await again.connect())[0]
    missed = await frames_until(again, is_ready)
    assert seqs(missed) == list(range(seen[-1] + 1, seen[-1] + 8))
    assert [f["event"]["summary"] for f in missed if f["type"] == "event"] == [f"while away {i}" for i in range(7)]
    await again.disconnect()


async def test_another_owners_task_is_refused_like_a_task_that_does_not_exist(box: Any) -> None:
    task_id = await waiting_task(box)
    stranger = await sync(make_owner)()
    session = await sync(session_cookie)(stranger)
    for path in (f"/ws/tasks/{task_id}/", "/ws/tasks/tkdoesnotexist/"):
        connected, code = await ws(path, session=session).connect()
        assert (connected, code) == (False, 4403), path


async def test_a_foreign_or_missing_origin_is_refused(box: Any) -> None:
    task_id = await waiting_task(box)
    session = await sync(session_cookie)(box.owner)
    for origin in (b"http://evil.example", b"http://127.0.0.1.evil.example:8000", None):
        connected, _ = await ws(f"/ws/tasks/{task_id}/", session=session, origin=origin).connect()
        assert not connected, origin


async def test_a_token_in_the_query_string_does_not_sign_anyone_in(box: Any) -> None:
    task_id = await waiting_task(box)
    connected, code = await ws(f"/ws/tasks/{task_id}/?after=0&token={box.token}").connect()
    assert (connected, code) == (False, 4401)
    connected, code = await ws(f"/ws/tasks/?token={box.token}").connect()
    assert (connected, code) == (False, 4401)


async def test_a_program_streams_with_its_token_in_the_authorization_header(box: Any, transport: str) -> None:
    task_id = await waiting_task(box)
    client = ws(f"/ws/tasks/{task_id}/?after=0", token=box.token)
    assert (await client.connect())[0]
    backlog = await frames_until(client, is_ready)
    assert seqs(backlog) == [e["seq"] for e in await sync(box.events)(task_id)]
    await client.disconnect()
    # a token that names nobody signs nobody in, even beside the owner's own session
    session = await sync(session_cookie)(box.owner)
    connected, code = await ws(f"/ws/tasks/{task_id}/", token="box_not-a-token", session=session).connect()
    assert (connected, code) == (False, 4401)
    # a stranger's token sees the task as not there
    _, strangers = await sync(issue_api_token)(await sync(make_owner)(), "stranger")
    connected, code = await ws(f"/ws/tasks/{task_id}/", token=strangers).connect()
    assert (connected, code) == (False, 4403)


async def test_a_revoked_token_is_cut_off_before_the_next_event(box: Any, transport: str) -> None:
    task_id = await waiting_task(box)
    client = ws(f"/ws/tasks/{task_id}/", token=box.token)
    assert (await client.connect())[0]
    await frames_until(client, is_ready)
    await sync(lambda: ApiToken.objects.update(revoked_at=timezone.now()))()
    await sync(record_notes)(task_id, 1, "secret progress")
    assert await client.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}


async def test_a_cookie_holding_nul_signs_nobody_in(box: Any) -> None:
    """PostgreSQL refuses NUL in a query: a session or device cookie holding one is dropped
    before any lookup, and the stream answers 4401 as for no cookie at all."""
    task_id = await waiting_task(box)
    session = await sync(session_cookie)(box.owner)
    for cookie in (dict(session="abc\x00def"), dict(device="abc\x00def"), dict(session=session[:4] + "\x00" + session[4:])):
        connected, code = await ws(f"/ws/tasks/{task_id}/", **cookie).connect()
        assert (connected, code) == (False, 4401), cookie
    # the other cookies of the header still count
    client = ws(f"/ws/tasks/{task_id}/", session=session, device="abc\x00def")
    assert (await client.connect())[0]
    await client.disconnect()


async def test_a_malformed_cursor_is_refused(box: Any) -> None:
    task_id = await waiting_task(box)
    session = await sync(session_cookie)(box.owner)
    connected, code = await ws(f"/ws/tasks/{task_id}/?after=-3", session=session).connect()
    assert (connected, code) == (False, 4400)


@pytest.mark.parametrize("after", ["1%00", "%00", "1e309", "1.5", "nan", "9" * 5000, "0x10"])
async def test_a_cursor_that_is_not_a_whole_number_is_refused(box: Any, after: str) -> None:
    session = await sync(session_cookie)(box.owner)
    task = await sync(box.create)(title="t", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    for path in (f"/ws/tasks/{task['id']}/?after={after}", f"/ws/tasks/?after={after}"):
        connected, code = await ws(path, session=session).connect()
        assert (connected, code) == (False, 4400), path


@pytest.mark.parametrize("after", [str(10**30), str(2**63), str(2**64)])
async def test_a_cursor_beyond_every_event_streams_nothing_old(box: Any, after: str) -> None:
    session = await sync(session_cookie)(box.owner)
    task = await sync(box.create)(title="t", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    for path in (f"/ws/tasks/{task['id']}/?after={after}", f"/ws/tasks/?after={after}"):
        client = ws(path, session=session)
        connected, code = await client.connect()
        if connected:
            frames = await frames_until(client, is_ready)
            assert not [f for f in frames if f["type"] == "event"], path
            await client.disconnect()
        else:
            assert code == 4400, path


async def test_a_device_never_streams_a_folder_task(box: Any, tmp_path: Any) -> None:
    folder = tmp_path / "real-folder"
    folder.mkdir()
    task = await sync(box.create)(title="on my folder", folder=str(folder), flow=WAITS_FOR_INPUT)
    device = await sync(pair_device)(box.api)
    connected, code = await ws(f"/ws/tasks/{task['id']}/", device=device).connect()
    assert (connected, code) == (False, 4403)


async def test_a_revoked_device_is_cut_off_before_the_next_event(box: Any, transport: str) -> None:
    device = await sync(pair_device)(box.api)

    phone = APIClient()
    phone.cookies[DEVICE_COOKIE] = device
    created = await sync(phone.post)("/api/tasks", {"title": "from the phone", "flow": WAITS_FOR_INPUT}, format="json")
    assert created.status_code == 201 and created.json()["source"] == "phone"
    task_id = created.json()["id"]
    await sync(box.wait_state)(task_id, "waiting")
    client = ws(f"/ws/tasks/{task_id}/", device=device)
    assert (await client.connect())[0]
    await frames_until(client, is_ready)

    devices = (await sync(box.api.get)("/api/devices")).json()["results"]
    assert (await sync(box.api.post)(f"/api/devices/{devices[0]['id']}/revoke")).status_code == 200
    await sync(record_notes)(task_id, 1, "secret progress")
    closed = await client.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4403}


async def test_a_signed_out_session_stops_streaming(box: Any, transport: str) -> None:
    task_id = await waiting_task(box)
    session = await sync(session_cookie)(box.owner)
    client = ws(f"/ws/tasks/{task_id}/", session=session)
    assert (await client.connect())[0]
    await frames_until(client, is_ready)
    await sync(lambda: Session.objects.filter(session_key=session).delete())()
    await sync(record_notes)(task_id, 1, "after sign-out")
    assert await client.receive_output(timeout=10) == {"type": "websocket.close", "code": 4403}


async def test_the_list_stream_shows_new_tasks_and_their_state_changes(box: Any, transport: str) -> None:
    client = ws("/ws/tasks/", session=await sync(session_cookie)(box.owner))
    assert (await client.connect())[0]
    await frames_until(client, is_ready)
    task_id = await waiting_task(box)

    def reached_waiting(fs: list[dict[str, Any]]) -> bool:
        return any(f["type"] == "task" and f["task"]["id"] == task_id and f["task"]["state"] == "waiting" for f in fs)

    frames = await frames_until(client, reached_waiting)
    cursor = frames[-1]["cursor"]
    await client.disconnect()

    # A list client that reconnects with its cursor is told about what changed meanwhile.
    assert (await sync(box.api.post)(f"/api/tasks/{task_id}/cancel")).status_code == 200
    again = ws(f"/ws/tasks/?after={cursor}", session=await sync(session_cookie)(box.owner))
    assert (await again.connect())[0]
    caught_up = await frames_until(again, is_ready)
    assert [f["task"]["state"] for f in caught_up if f["type"] == "task"] == ["cancelled"]
    await again.disconnect()


async def test_a_device_list_stream_shows_only_that_devices_tasks(box: Any, transport: str) -> None:
    device = await sync(pair_device)(box.api)
    client = ws("/ws/tasks/", device=device)
    assert (await client.connect())[0]
    await frames_until(client, is_ready)
    owners = await waiting_task(box)
    phone = APIClient()
    phone.cookies[DEVICE_COOKIE] = device
    created = await sync(phone.post)("/api/tasks", {"title": "asked on the phone", "flow": WAITS_FOR_INPUT}, format="json")
    mine = created.json()["id"]
    frames = await frames_until(client, lambda fs: any(f["type"] == "task" and f["task"]["id"] == mine for f in fs))
    assert owners not in {f["task"]["id"] for f in frames if f["type"] == "task"}
    await client.disconnect()

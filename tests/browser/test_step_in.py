"""A person steps in at a wall: the browser stays open on the wall's page, its owner sees it live
and drives it over ``/ws/tasks/<id>/browser/`` (relayed clicks and keys), a one-time code
answered in the inbox is typed into the field the wall showed, and continuing goes on from that
page: nothing is opened again. A kept browser nobody uses is closed after the idle limit."""
from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from boxsite.core.errors import InvalidRequest
from tasks.browser import screencast
from tasks.browser.session import read_record
from tests.browser.sites_walls import BUTTON_BOX, PASSWORD_BOX, USER_BOX, WallSite, middle, serve
from tests.browser.test_walls_payment import chromium_of
from tests.conftest import wait_for
from tests.factories import flow, make_owner
from tests.pauses.helpers import cont, open_questions, post, report
from tests.portal.conftest import pair_device, session_cookie, ws


def run(coroutine: Any) -> Any:
    """Run a WebSocket client's coroutine; the connection the consumer's database reads opened in
    asgiref's thread is closed after it, so the test database can be dropped."""

    async def then_close() -> Any:
        try:
            return await coroutine
        finally:
            await database_sync_to_async(connections.close_all)()

    return asyncio.run(then_close())


@pytest.fixture
def walls(chromium: None) -> Iterator[WallSite]:
    with serve() as running:
        yield running


def at_the_wall(box: Any, site: WallSite, page: str, *, timeout_s: float = 1) -> str:
    """A task that opens ``page`` and then waits for "Continue to checkout", which the wall hides;
    returns its id once it waits for a person, its browser kept."""
    task = box.create(title=page, hosts=["127.0.0.1"], flow=flow(
        {"browse": f"{site.url}{page}"}, {"click": {"text": "Continue to checkout"}, "timeout_s": timeout_s},
        {"extract": "h1", "save": "heading"}))
    view = box.wait_state(task["id"], "waiting", "failed", timeout=90)
    assert (view["state"], view["waitingFor"]) == ("waiting", "human"), view
    assert chromium_of(task["id"]), "the wall released its browser"
    return str(task["id"])


async def next_frame(client: WebsocketCommunicator, kind: str, *, timeout: float = 20) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AssertionError(f"no {kind} frame within {timeout} s")
        frame = await client.receive_json_from(timeout=left)
        if frame["type"] == kind:
            return frame


async def until(condition: Any, what: str, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def click(client: WebsocketCommunicator, box: tuple[int, int, int, int]) -> None:
    x, y = middle(box)
    for action in ("move", "down", "up"):
        await client.send_json_to({"type": "mouse", "action": action, "x": x, "y": y,
                                   **({"button": "left", "clicks": 1} if action != "move" else {})})


async def type_keys(client: WebsocketCommunicator, text: str) -> None:
    for char in text:
        await client.send_json_to({"type": "key", "action": "down", "key": char})
        await client.send_json_to({"type": "key", "action": "up", "key": char})


def test_a_login_wall_is_passed_by_a_person_through_the_live_view_and_nothing_is_opened_again(sandboxed, walls):
    task_id = at_the_wall(sandboxed, walls, "/members")
    [question] = open_questions(sandboxed, task_id)
    assert "a login form" in question["prompt"] and "live view" in question["prompt"]

    cookie = session_cookie(sandboxed.owner)

    async def sign_in() -> None:
        client = ws(f"/ws/tasks/{task_id}/browser/", session=cookie)
        connected, _ = await client.connect(timeout=20)
        assert connected
        ready = await next_frame(client, "ready")
        assert (ready["width"], ready["height"]) == (1280, 900)
        frame = await next_frame(client, "frame")
        assert base64.b64decode(frame["data"])[:3] == b"\xff\xd8\xff"  # a JPEG of the page
        # A bad input gets an answer in the error shape, and nothing reaches the page.
        await client.send_json_to({"type": "mouse", "action": "down", "x": -5, "y": 10})
        error = await next_frame(client, "error")
        assert error["error"] == {"code": "INVALID_REQUEST", "message": error["error"]["message"], "field": "x"}
        await click(client, USER_BOX)
        await type_keys(client, "alice")
        await click(client, PASSWORD_BOX)
        await client.send_json_to({"type": "text", "text": "s3cret"})
        await click(client, BUTTON_BOX)
        await until(lambda: walls.gets["/members/home"] == 1, "the signed-in page to open")
        await next_frame(client, "frame")  # the view goes on with the page the person reached
        await client.disconnect()

    run(sign_in())
    assert walls.bodies["/members/login"] == [{"user": ["alice"], "password": ["s3cret"]}]
    assert cont(sandboxed, task_id, answer="signed in").status_code == 200
    view = sandboxed.wait_state(task_id, "done", "failed", timeout=90)
    events = sandboxed.events(task_id)
    assert view["state"] == "done", (view["error"], [e["summary"] for e in events])
    # The step went on from the page the person left: same browser (its cookie), no page opened again.
    assert report(sandboxed, task_id)["records"]["heading"] == [{"value": "Checkout for alice"}]
    assert walls.gets["/members"] == 1 and walls.gets["/members/home"] == 1 and walls.posts["/members/login"] == 1
    assert any(e["data"].get("kept") for e in events if e["kind"] == "note")
    assert not any(e["data"].get("replayed") for e in events if e["kind"] == "note")


def test_a_one_time_code_answered_in_the_inbox_is_typed_into_the_field_the_wall_showed(sandboxed, walls):
    task_id = at_the_wall(sandboxed, walls, "/verify", timeout_s=3)
    [question] = open_questions(sandboxed, task_id)
    # The page says nothing of a code in words: its field's autocomplete="one-time-code" is the sign.
    assert "a one-time-code prompt" in question["prompt"]
    assert [(f["name"], f.get("optional")) for f in question["fields"]] == [("one_time_code", True)]
    answered = post(sandboxed, f"/api/questions/{question['id']}/answer", {"inputs": {"one_time_code": "424242"}})
    assert answered.status_code == 200, answered.json()
    view = sandboxed.wait_state(task_id, "done", "failed", timeout=90)
    events = sandboxed.events(task_id)
    assert view["state"] == "done", (view["error"], [e["summary"] for e in events])
    assert walls.bodies["/verify"] == [{"code": ["424242"]}]
    assert walls.gets["/verify"] == 1  # typed into the page the wall showed, not a page opened again
    assert any("typed the one-time code" in e["summary"] for e in events)
    assert "424242" not in str(events)  # a secret: never in the log


def test_an_idle_kept_browser_is_closed_with_a_note(sandboxed, walls, settings):
    settings.BOX_BROWSER_IDLE_SECONDS = 1
    task_id = at_the_wall(sandboxed, walls, "/members")
    wait_for(lambda: any(e["data"].get("idleClosed") for e in sandboxed.events(task_id)), timeout=60,
             what="the idle browser's note")
    wait_for(lambda: chromium_of(task_id) == [], timeout=30, what="the idle browser to be gone")
    assert read_record(task_id) is None
    [note] = [e for e in sandboxed.events(task_id) if e["data"].get("idleClosed")]
    assert "nobody used it for 1 s" in note["summary"]
    # The live view says there is nothing to see; continuing opens the page again.
    cookie = session_cookie(sandboxed.owner)
    assert run(refused(ws(f"/ws/tasks/{task_id}/browser/", session=cookie))) == 4404
    assert cont(sandboxed, task_id, answer="go on").status_code == 200
    view = sandboxed.wait_state(task_id, "waiting", "failed", timeout=90)
    assert view["waitingFor"] == "human" and walls.gets["/members"] == 2


async def refused(client: WebsocketCommunicator) -> int | str | None:
    """The close code a connection was refused with (``"refused"`` without one), or None."""
    connected, code = await client.connect(timeout=20)
    if connected:
        await client.disconnect()
        return None
    return code if isinstance(code, int) else "refused"


def test_only_the_owner_or_their_phone_may_view_or_drive_the_kept_browser(sandboxed, walls):
    task_id = at_the_wall(sandboxed, walls, "/members")
    stranger = make_owner()
    path = f"/ws/tasks/{task_id}/browser/"
    theirs, mine, device = session_cookie(stranger), session_cookie(sandboxed.owner), pair_device(sandboxed.api)

    async def check() -> None:
        assert await refused(ws(path)) == 4401  # nobody signed in
        assert await refused(ws(path, session=theirs)) == 4403  # another owner: no view, no input
        assert await refused(ws(path, session=mine, origin=b"http://evil.example")) is not None  # another site's page
        phone = ws(path, device=device)
        connected, _ = await phone.connect(timeout=20)
        assert connected  # the owner's paired phone sees it
        await next_frame(phone, "frame")
        for bad, field in [({"type": "scroll"}, "type"), ({"type": "key", "action": "down", "key": "x" * 40}, "key"),
                           ({"type": "text", "text": ""}, "text"), ([1, 2], "type")]:
            await phone.send_json_to(bad)
            error = await next_frame(phone, "error")
            assert error["error"]["code"] == "INVALID_REQUEST" and error["error"]["field"] == field, error
        await phone.send_to(text_data="not json")
        assert (await next_frame(phone, "error"))["error"]["code"] == "INVALID_REQUEST"
        await phone.disconnect()

    run(check())
    assert walls.posts["/members/login"] == 0


def test_the_inputs_a_viewer_may_relay_are_bounded():
    assert screencast.parse_input({"type": "mouse", "action": "down", "x": 10, "y": 20.5}) == (
        "Input.dispatchMouseEvent", {"type": "mousePressed", "x": 10.0, "y": 20.5, "modifiers": 0, "button": "left",
                                     "clickCount": 1})
    assert screencast.parse_input({"type": "key", "action": "down", "key": "Enter"})[1] == {
        "type": "keyDown", "key": "Enter", "modifiers": 0, "windowsVirtualKeyCode": 13, "text": "\r"}
    assert screencast.parse_input({"type": "text", "text": "héllo"}) == ("Input.insertText", {"text": "héllo"})
    for bad, field in [({"type": "mouse", "action": "down", "x": 1e9, "y": 0}, "x"),
                       ({"type": "mouse", "action": "down", "x": float("nan"), "y": 0}, "x"),
                       ({"type": "mouse", "action": "click", "x": 1, "y": 1}, "action"),
                       ({"type": "mouse", "action": "down", "x": 1, "y": 1, "button": "fourth"}, "button"),
                       ({"type": "mouse", "action": "down", "x": 1, "y": 1, "clicks": 9}, "clicks"),
                       ({"type": "key", "action": "down"}, "key"),
                       ({"type": "text", "text": "x" * 1001}, "text"), ("click", "type")]:
        with pytest.raises(InvalidRequest) as refused_input:
            screencast.parse_input(bad)
        assert refused_input.value.field == field


@pytest.mark.parametrize(("page", "wall"), [("/captcha-frame", "a captcha"), ("/quiet-password", "a login form"),
                                            ("/hidden-password", None)])
def test_a_wall_is_read_from_the_pages_dom_and_frames_not_only_its_words(sandboxed, walls, page, wall):
    """No page here says "captcha" or "sign in": a captcha provider's frame and a password field a
    person can see are the signs; a password field nobody can see is not a wall."""
    task = sandboxed.create(title=page, hosts=["127.0.0.1"], flow=flow(
        {"browse": f"{walls.url}{page}"}, {"click": {"text": "Continue to checkout"}, "timeout_s": 0.5}))
    view = sandboxed.wait_state(task["id"], "waiting", "failed", timeout=90)
    if wall is None:
        assert view["state"] == "failed", view
        return
    assert view["waitingFor"] == "human", view
    [question] = open_questions(sandboxed, task["id"])
    assert wall in question["prompt"]

"""``/ws/tasks/<id>/browser/``: the live view of a task's kept browser
(docs/internals/browser.md#a-person-steps-in), and the person's input relayed into it.

Who may connect is who may answer the task's questions (the owner's session or token; a paired
phone, for the owner's tasks but folder tasks, as its inbox), never a task itself; credentials
and access are checked again every few seconds while it is open. It needs no channel layer: it talks to the
browser directly (``tasks.browser.screencast``), so it works the same embedded and with Redis.

Frames (JSON) to the viewer:
  {"type": "ready", "task": id, "width": w, "height": h}   the page's size in CSS pixels
  {"type": "frame", "data": base64 JPEG, "width": w, "height": h}
  {"type": "error", "error": {"code", "message", "field"}}   an input refused; nothing was sent
  {"type": "closed", "message": ...}   the browser went (the run closed it, idle, the task ended)
From the viewer: inputs as ``tasks.browser.screencast.parse_input`` takes them, one per message.

Close codes: 4401 not signed in, 4403 no access (or no such task: never reveal), 4404 no kept
browser, 4408 too many inputs in a row.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from boxsite.core.errors import BoxError, InvalidRequest
from boxsite.core.principal import Principal, Via
from boxsite.core.ws_auth import signed_in, still_signed_in
from tasks.browser.cdp import CdpError
from tasks.browser.screencast import NoBrowser, Screencast
from tasks.models import Task

CHECK_EVERY_S = 5.0
MAX_MESSAGE_CHARS = 4096
INPUTS_PER_SECOND = 100  # a person typing and moving the mouse stays well under it
REFUSED_IN_A_ROW = 50  # this many refused inputs without a good one: a program, not a person

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NO_BROWSER = 4404
CLOSE_FLOODED = 4408


class BrowserViewConsumer(AsyncJsonWebsocketConsumer):
    principal: Principal
    session_key: str | None
    view: Screencast | None = None
    _tasks: list[asyncio.Task[None]]

    async def connect(self) -> None:
        self._tasks = []
        who = signed_in(self.scope)
        if who is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.principal, self.session_key = who
        self.task_id = str(self.scope["url_route"]["kwargs"]["task_id"])
        if self.principal.via == Via.TASK or not await database_sync_to_async(self.may_see)():
            await self.close(code=CLOSE_FORBIDDEN)
            return
        view = Screencast(self.task_id)
        try:
            await view.open()
        except NoBrowser:
            await self.close(code=CLOSE_NO_BROWSER)
            return
        self.view = view
        self.window_start, self.window_count, self.refused = time.monotonic(), 0, 0
        await self.accept()
        await self.send_json({"type": "ready", "task": self.task_id, "width": view.size[0], "height": view.size[1]})
        self._tasks = [asyncio.create_task(self.pump()), asyncio.create_task(self.check_forever())]

    def may_see(self) -> bool:
        """Whoever may answer the task's questions (``inbox_of``: the owner; a paired phone, for
        any of the owner's tasks but folder tasks) may pass its wall in the live view."""
        if not Task.objects.inbox_of(self.principal).filter(pk=self.task_id).exists():
            return False
        return still_signed_in(self.principal, self.session_key)

    async def pump(self) -> None:
        assert self.view is not None
        async for frame in self.view.frames():
            await self.send_json(frame)
        await self.send_json({"type": "closed", "message": "the browser is closed"})
        await self.close(code=CLOSE_NO_BROWSER)

    async def check_forever(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if not await database_sync_to_async(self.may_see)():
                await self.close(code=CLOSE_FORBIDDEN)
                return

    async def disconnect(self, code: int) -> None:
        for task in self._tasks:
            task.cancel()
        if self.view is not None:
            view, self.view = self.view, None
            with contextlib.suppress(Exception):
                await view.close()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if text_data is None or len(text_data) > MAX_MESSAGE_CHARS:
            await self.refuse(InvalidRequest(f"an input is one JSON text message of at most {MAX_MESSAGE_CHARS} characters"))
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            await self.refuse(InvalidRequest("an input is a JSON object"))
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.view is None:
            return
        now = time.monotonic()
        if now - self.window_start >= 1.0:
            self.window_start, self.window_count = now, 0
        self.window_count += 1
        if self.window_count > INPUTS_PER_SECOND:
            await self.refuse(BoxError(f"at most {INPUTS_PER_SECOND} inputs a second", code="THROTTLED"))
            return
        try:
            await self.view.relay(content)
        except BoxError as exc:
            await self.refuse(exc)
            return
        except CdpError as exc:
            await self.send_json({"type": "error", "error": {"code": "NOT_AVAILABLE", "message": str(exc), "field": None}})
            return
        self.refused = 0

    async def refuse(self, error: BoxError) -> None:
        await self.send_json({"type": "error", "error": error.as_dict()})
        self.refused += 1
        if self.refused >= REFUSED_IN_A_ROW:
            await self.close(code=CLOSE_FLOODED)

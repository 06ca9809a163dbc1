"""The live view of a kept browser: its page as a stream of images, and a person's clicks and
keys relayed into it (docs/internals/browser.md#a-person-steps-in).

A web process reaches the browser a pause kept (``BrowserSession.park``) from its record, as a
later run does: over DevTools, from a thread that joins the task's network namespace when the
browser is sandboxed (``tasks.browser.relay.connect_in_namespace``). It attaches to the page and
asks for ``Page.startScreencast``; each frame goes to the viewer and is acknowledged once sent,
so a slow viewer slows the stream instead of piling frames up. Input is what ``parse_input``
accepts, nothing else: mouse presses, releases, moves and wheel turns inside the page, key
presses with a bounded key name, and bounded text; each becomes one ``Input.dispatch*`` or
``Input.insertText`` command.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from boxsite.core.errors import InvalidRequest
from tasks.browser import kept
from tasks.browser.cdp import Cdp, CdpError
from tasks.browser.relay import connect_in_namespace
from tasks.browser.session import DEVTOOLS_PORT, WINDOW, read_record, start_time

MAX_TEXT = 1000  # characters one text input may insert
MAX_KEY = 32  # a key's name ("Enter", "ArrowLeft", "a")
MAX_COORDINATE = 20_000  # CSS pixels: far past any page's viewport, short of nonsense
MAX_WHEEL = 10_000
FRAME_QUALITY = 70

_MOUSE = {"down": "mousePressed", "up": "mouseReleased", "move": "mouseMoved", "wheel": "mouseWheel"}
_BUTTONS = ("none", "left", "middle", "right")
_KEYS = {"down": "keyDown", "up": "keyUp"}
# Keys that do something without typing a character: DevTools needs their Windows key code.
_KEY_CODES = {"Enter": 13, "Backspace": 8, "Tab": 9, "Escape": 27, "Delete": 46, "Home": 36, "End": 35,
              "PageUp": 33, "PageDown": 34, "ArrowLeft": 37, "ArrowUp": 38, "ArrowRight": 39, "ArrowDown": 40,
              "Shift": 16, "Control": 17, "Alt": 18, "Meta": 91, " ": 32}
_KEY_TEXT = {"Enter": "\r", " ": " "}


class NoBrowser(Exception):
    """The task has no kept browser (none was kept, or it is gone)."""


def parse_input(message: Any) -> tuple[str, dict[str, Any]]:
    """One relayed input as the DevTools command it becomes; ``InvalidRequest`` (naming the
    field at fault) for anything else."""
    if not isinstance(message, dict):
        raise InvalidRequest("an input is an object with a 'type': mouse, key or text", field="type")
    kind = message.get("type")
    if kind == "mouse":
        action = _choice(message, "action", _MOUSE)
        params: dict[str, Any] = {"type": _MOUSE[action], "x": _number(message, "x", 0, MAX_COORDINATE),
                                  "y": _number(message, "y", 0, MAX_COORDINATE),
                                  "modifiers": _integer(message, "modifiers", 0, 15, 0)}
        if action == "wheel":
            params.update(deltaX=_number(message, "deltaX", -MAX_WHEEL, MAX_WHEEL, 0),
                          deltaY=_number(message, "deltaY", -MAX_WHEEL, MAX_WHEEL, 0))
        else:
            button = message.get("button", "left" if action != "move" else "none")
            if button not in _BUTTONS:
                raise InvalidRequest(f"'button' is one of {', '.join(_BUTTONS)}", field="button")
            params.update(button=button, clickCount=_integer(message, "clicks", 0, 3, 1 if action != "move" else 0))
        return "Input.dispatchMouseEvent", params
    if kind == "key":
        action = _choice(message, "action", _KEYS)
        key = message.get("key")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise InvalidRequest(f"'key' is a key's name of at most {MAX_KEY} characters", field="key")
        params = {"type": _KEYS[action], "key": key, "modifiers": _integer(message, "modifiers", 0, 15, 0)}
        code = message.get("code")
        if code is not None:
            if not isinstance(code, str) or len(code) > MAX_KEY:
                raise InvalidRequest(f"'code' is a key's code of at most {MAX_KEY} characters", field="code")
            params["code"] = code
        if key in _KEY_CODES:
            params["windowsVirtualKeyCode"] = _KEY_CODES[key]
        elif len(key) == 1 and key.isascii() and key.isalnum():
            params["windowsVirtualKeyCode"] = ord(key.upper())
        text = _KEY_TEXT.get(key, key if len(key) == 1 else None)
        if action == "down" and text is not None and not params["modifiers"] & 0b1010:  # not with Ctrl or Meta
            params["text"] = text
        elif action == "down":
            params["type"] = "rawKeyDown"
        return "Input.dispatchKeyEvent", params
    if kind == "text":
        text = message.get("text")
        if not isinstance(text, str) or not text or len(text) > MAX_TEXT:
            raise InvalidRequest(f"'text' is text of 1 to {MAX_TEXT} characters", field="text")
        return "Input.insertText", {"text": text}
    raise InvalidRequest("'type' is one of mouse, key or text", field="type")


def _choice(message: dict[str, Any], name: str, allowed: dict[str, str]) -> str:
    value = message.get(name)
    if not isinstance(value, str) or value not in allowed:
        raise InvalidRequest(f"'{name}' is one of {', '.join(allowed)}", field=name)
    return value


def _number(message: dict[str, Any], name: str, low: float, high: float, default: float | None = None) -> float:
    value = message.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise InvalidRequest(f"'{name}' is a number from {low:g} to {high:g}", field=name)
    return float(value)


def _integer(message: dict[str, Any], name: str, low: int, high: int, default: int) -> int:
    value = message.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"'{name}' is a whole number from {low} to {high}", field=name)
    return value


def kept_record(task_id: str) -> dict[str, Any] | None:
    """The record of the task's kept browser while that browser runs, else None."""
    record = read_record(task_id)
    if record is None or not isinstance(record.get("pid"), int) or record.get("start") is None:
        return None
    return record if start_time(record["pid"]) == record["start"] else None


class Screencast:
    """One viewer's connection to a task's kept browser."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self._cdp: Cdp | None = None
        self._session: str | None = None
        self.size = WINDOW
        self._touched = 0.0

    async def open(self) -> None:
        """Reach the kept browser and start its screencast; ``NoBrowser`` when there is none."""
        record = await asyncio.to_thread(kept_record, self.task_id)
        if record is None:
            raise NoBrowser(f"task {self.task_id} has no browser kept open")
        try:
            if record.get("pidns") is not None:
                sock = await asyncio.to_thread(connect_in_namespace, int(record["pid"]), DEVTOOLS_PORT)
                reader, writer = await asyncio.open_connection(sock=sock)
                host = f"127.0.0.1:{DEVTOOLS_PORT}"
            else:
                where = urlsplit(str(record["url"]))
                reader, writer = await asyncio.open_connection(where.hostname, where.port)
                host = where.netloc
            self._cdp = await Cdp.open(reader, writer, str(record["path"]), host)
            targets = (await self._cdp.send("Target.getTargets"))["targetInfos"]
            pages = [t for t in targets if t.get("type") == "page"]
            if not pages:
                raise NoBrowser("the kept browser has no page open")
            attached = await self._cdp.send("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True})
            self._session = str(attached["sessionId"])
            await self._cdp.send("Page.startScreencast", {"format": "jpeg", "quality": FRAME_QUALITY, "maxWidth": WINDOW[0],
                                                          "maxHeight": WINDOW[1], "everyNthFrame": 1}, session=self._session)
        except (OSError, CdpError, KeyError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            await self.close()
            raise NoBrowser(f"the kept browser could not be reached: {exc}") from exc

    async def frames(self) -> AsyncIterator[dict[str, Any]]:
        """The page's frames, as the viewer gets them, until the browser goes."""
        assert self._cdp is not None
        while True:
            event = await self._cdp.events.get()
            if event is None:
                return
            if event.get("method") != "Page.screencastFrame" or event.get("sessionId") != self._session:
                continue
            params = event.get("params") or {}
            meta = params.get("metadata") or {}
            self.size = (int(meta.get("deviceWidth") or WINDOW[0]), int(meta.get("deviceHeight") or WINDOW[1]))
            yield {"type": "frame", "data": params.get("data", ""), "width": self.size[0], "height": self.size[1]}
            try:
                await self._cdp.send("Page.screencastFrameAck", {"sessionId": params.get("sessionId")}, session=self._session)
            except CdpError:
                return

    async def relay(self, message: Any) -> None:
        """Send one input to the page (``InvalidRequest`` for a bad one, ``CdpError`` when the
        browser refused it or is gone)."""
        method, params = parse_input(message)
        if self._cdp is None:
            raise CdpError("the browser is gone")
        await self._cdp.send(method, params, session=self._session)
        now = time.monotonic()
        if now - self._touched >= kept.TOUCH_EVERY_S:  # someone is using it: not idle
            self._touched = now
            await asyncio.to_thread(kept.touch, self.task_id)

    async def close(self) -> None:
        if self._cdp is not None:
            cdp, self._cdp = self._cdp, None
            await cdp.close()

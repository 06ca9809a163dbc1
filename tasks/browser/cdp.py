"""A small asyncio client of Chromium's DevTools protocol, for the live view of a kept browser
(``tasks.browser.screencast``), where Playwright's synchronous driver has no place: a web
process serves many live views on one event loop.

It speaks just what DevTools needs of WebSocket (RFC 6455 as a client: one handshake, masked
text frames out, unmasked frames in, ping and close) over a stream the caller opened, and
matches answers to commands by id; events go to one queue.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import struct
from typing import Any

MAX_MESSAGE = 32 * 1024 * 1024  # a screenshot frame is far smaller; anything larger is refused
COMMAND_TIMEOUT_S = 10.0


class CdpError(Exception):
    """DevTools refused a command, or the connection ended."""


class Cdp:
    """One DevTools connection. ``events`` holds every event (method, params, sessionId)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        # Unbounded, yet small: no domain is enabled but the screencast, whose next frame waits
        # for the last one's acknowledgement.
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._reading: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, host: str) -> Cdp:
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), COMMAND_TIMEOUT_S)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            writer.close()
            raise CdpError(f"DevTools refused the connection: {status.decode(errors='replace')[:100]}")
        cdp = cls(reader, writer)
        cdp._reading = asyncio.create_task(cdp._read_forever())
        return cdp

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None) -> dict[str, Any]:
        """Run one command; its result (``CdpError`` when DevTools refused it)."""
        if self.closed.is_set():
            raise CdpError("the browser is gone")
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = answer
        try:
            await self._write(json.dumps(message).encode())
            reply = await asyncio.wait_for(answer, COMMAND_TIMEOUT_S)
        finally:
            self._waiting.pop(ident, None)
        if "error" in reply:
            raise CdpError(str(reply["error"].get("message", "DevTools refused the command"))[:300])
        result: dict[str, Any] = reply.get("result") or {}
        return result

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(BaseException):
                await self._reading
        self._end()
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    # -- the wire -----------------------------------------------------------------------------
    async def _write(self, payload: bytes, opcode: int = 0x1) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._writer.write(head + mask + masked)
        await self._writer.drain()

    async def _frame(self) -> tuple[bool, int, bytes]:
        first, second = await self._reader.readexactly(2)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", await self._reader.readexactly(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", await self._reader.readexactly(8))
        if size > MAX_MESSAGE:
            raise CdpError("DevTools sent a message too large to relay")
        mask = await self._reader.readexactly(4) if second & 0x80 else b""
        data = await self._reader.readexactly(size)
        if mask:
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        return bool(first & 0x80), first & 0x0F, data

    async def _read_forever(self) -> None:
        parts: list[bytes] = []
        try:
            while True:
                fin, opcode, data = await self._frame()
                if opcode == 0x8:
                    return
                if opcode == 0x9:
                    await self._write(data, 0xA)
                    continue
                if opcode in (0x1, 0x2, 0x0):
                    parts.append(data)
                    if sum(map(len, parts)) > MAX_MESSAGE:
                        raise CdpError("DevTools sent a message too large to relay")
                    if fin:
                        message = json.loads(b"".join(parts))
                        parts = []
                        await self._deliver(message)
        except (asyncio.IncompleteReadError, ConnectionError, CdpError, ValueError, OSError):
            return
        finally:
            self._end()

    async def _deliver(self, message: dict[str, Any]) -> None:
        if "id" in message:
            waiting = self._waiting.get(message["id"])
            if waiting is not None and not waiting.done():
                waiting.set_result(message)
            return
        await self.events.put(message)

    def _end(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(CdpError("the browser is gone"))
        self.events.put_nowait(None)

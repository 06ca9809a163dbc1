"""A real local HTTP server speaking the chat-completions protocol, scripted per test.

Each request to ``POST /v1/chat/completions`` takes the next answer from the script (or asks a
function ``answer(request_body) -> Answer``). An answer is text, tool calls, an HTTP error,
bytes that are not a completion, or a slow answer. Every request is recorded whole (headers and
raw body) so a test can hunt secrets in everything the box sent.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Answer:
    content: str | None = None
    # (name, arguments): a dict is sent as JSON, a string as it is (arguments cut or not JSON)
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    usage: tuple[int, int] = (100, 20)  # prompt, completion tokens
    status: int = 200
    error: str = ""  # with status >= 400: the error message
    raw: bytes | None = None  # sent as the body instead of a completion
    delay_s: float = 0.0
    finish_reason: str = ""  # sent instead of "stop"/"tool_calls" (e.g. "length": cut at the output limit)


def say(text: str, usage: tuple[int, int] = (100, 20)) -> Answer:
    return Answer(content=text, usage=usage)


def call(tool: str, /, **arguments: Any) -> Answer:
    """An answer that calls ``tool`` with ``arguments``."""
    return Answer(tool_calls=[(tool, arguments)])


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    at: float = 0.0  # time.monotonic() when the request arrived
    answered_at: float = 0.0  # ... and when its answer was written

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))


class FakeModel:
    """The server. ``script`` answers in order; ``fallback`` answers once it is used up."""

    def __init__(self) -> None:
        self.script: list[Answer | Callable[[dict[str, Any]], Answer]] = []
        self.fallback: Answer | Callable[[dict[str, Any]], Answer] | None = None
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._ids = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fake._handle(self, raw)

            def do_GET(self) -> None:
                self._send(200, json.dumps({"data": [{"id": "fake-model", "object": "model"}]}).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-model", daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, *answers: Answer | Callable[[dict[str, Any]], Answer]) -> None:
        self.script.extend(answers)

    def _next(self, body: dict[str, Any]) -> Answer:
        with self._lock:
            item = self.script.pop(0) if self.script else self.fallback
        if item is None:
            return Answer(status=500, error="the fake model's script is used up")
        return item(body) if callable(item) else item

    def _handle(self, handler: Any, raw: bytes) -> None:
        received = Received(handler.path, {k.lower(): v for k, v in handler.headers.items()}, raw, at=time.monotonic())
        self.received.append(received)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        answer = self._next(body)
        if answer.delay_s:
            time.sleep(answer.delay_s)
        if answer.raw is not None:
            payload = answer.raw
            status = answer.status
        elif answer.status >= 400:
            payload = json.dumps({"error": {"message": answer.error or "error", "type": "fake"}}).encode()
            status = answer.status
        else:
            payload = json.dumps(self._completion(body, answer)).encode()
            status = 200
        try:
            handler._send(status, payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
        received.answered_at = time.monotonic()

    def _completion(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        with self._lock:
            self._ids += 1
            n = self._ids
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                for i, (name, args) in enumerate(answer.tool_calls)
            ]
        return {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": answer.finish_reason or ("tool_calls" if answer.tool_calls else "stop")}],
            "usage": {"prompt_tokens": answer.usage[0], "completion_tokens": answer.usage[1],
                      "total_tokens": answer.usage[0] + answer.usage[1]},
        }

    def everything_sent(self) -> str:
        """Every request as text: headers (but the key the box must send), raw body, and the
        body with JSON escapes undone."""
        parts = []
        for r in self.received:
            parts.append(json.dumps({k: v for k, v in r.headers.items() if k != "authorization"}))
            parts.append(r.raw.decode("utf-8", "replace"))
            try:
                parts.append(json.dumps(json.loads(r.raw), ensure_ascii=False))
            except ValueError:
                pass
        return "\n".join(parts)


def secret_forms(value: str) -> list[str]:
    """The encodings a secret could leak in: as is, base64, and JSON-escaped."""
    forms = [value, base64.b64encode(value.encode()).decode().rstrip("="), json.dumps(value)[1:-1]]
    return [f for f in forms if f]


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    server = FakeModel()
    yield server
    server.close()

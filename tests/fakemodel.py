"""A real local HTTP server speaking the chat-completions protocol, scripted per test: a
conformance fake that holds the box to what real endpoints demand.

Each request to ``POST /v1/chat/completions`` takes the next answer from the script (or asks a
function ``answer(request_body) -> Answer``). An answer is text, tool calls, an HTTP error (with
``Retry-After``), a cut connection, bytes that are not a completion, or a slow answer. Every
request is recorded whole (headers and raw body) so a test can hunt secrets in everything the
box sent.

Before answering, the fake checks the request as strict servers do and answers 400 (recorded in
``problems``) when it breaks a rule: roles out of order, a tool result not paired with a call of
the assistant message before it, a call left unanswered, ``max_tokens`` sent to a gpt-5/o-series
model, a parameter in ``refuses``, or more than ``context_tokens`` tokens (counted as characters
/ 4), the prompt alone or with the output it asks for (``max_completion_tokens``/``max_tokens``),
as vLLM refuses it. A request with ``stream: true`` is answered as server-sent events in small chunks, a tool
call's arguments split across them, the usage in a last chunk when ``stream_options`` asks.
"""
from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

ROLES = ("system", "developer", "user", "assistant", "tool")
NEW_CAP_ONLY = re.compile(r"^(gpt-5|o1|o3|o4)", re.IGNORECASE)  # models refusing max_tokens


@dataclass
class Answer:
    content: str | None = None
    # (name, arguments): a dict is sent as JSON, a string as it is (arguments cut or not JSON)
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    usage: tuple[int, int] = (100, 20)  # prompt, completion tokens
    status: int = 200
    error: str = ""  # with status >= 400: the error message
    raw: bytes | None = None  # sent as the body instead of a completion
    delay_s: float = 0.0  # before the answer begins
    retry_after: str | None = None  # with an error status: the Retry-After header
    cut: bool = False  # the connection drops: mid-stream after a few chunks, or before any answer
    cached_tokens: int = 0  # of the prompt tokens, those served from a cache
    finish_reason: str = ""  # instead of stop / tool_calls (e.g. "length")
    raw_arguments: list[str] | None = None  # each tool call's arguments as given, even if not JSON
    chunk_delay_s: float = 0.0  # between streamed chunks (or, unstreamed, the same in all first)


def say(text: str, usage: tuple[int, int] = (100, 20)) -> Answer:
    return Answer(content=text, usage=usage)


def call(tool: str, /, **arguments: Any) -> Answer:
    """An answer that calls ``tool`` with ``arguments``."""
    return Answer(tool_calls=[(tool, arguments)])


def thinking(thought: str, text: str) -> Answer:
    """An answer written the way reasoning models write it: the thought in ``<think>`` tags first."""
    return Answer(content=f"<think>{thought}</think>\n{text}")


def busy(retry_after: str | None = "0", status: int = 429) -> Answer:
    return Answer(status=status, error="rate limit reached, try again later" if status == 429 else "overloaded",
                  retry_after=retry_after)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes
    at: float = 0.0  # time.monotonic() when the request arrived
    answered_at: float = 0.0  # ... and when its answer was written
    status: int = 0  # what the fake answered

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def tokens(self) -> int:
        """The request's size as the fake counts it against ``context_tokens``."""
        body = self.body
        return len(json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))) // 4


class Cut(Exception):
    """The answer's connection is dropped here."""


class FakeModel:
    """The server. ``script`` answers in order; ``fallback`` answers once it is used up."""

    def __init__(self) -> None:
        self.script: list[Answer | Callable[[dict[str, Any]], Answer]] = []
        self.fallback: Answer | Callable[[dict[str, Any]], Answer] | None = None
        self.received: list[Received] = []
        self.problems: list[str] = []  # every rule a request broke (each answered 400)
        self.refuses: set[str] = set()  # request parameters answered with a 400 naming them
        self.context_tokens: int | None = None  # past this many tokens (characters / 4): 400
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
                if self.path.rstrip("/").endswith("/models"):
                    entry: dict[str, Any] = {"id": "fake-model", "object": "model"}
                    if fake.context_tokens is not None:
                        entry["max_model_len"] = fake.context_tokens
                    self._send(200, json.dumps({"object": "list", "data": [entry]}).encode())
                else:
                    self._send(404, json.dumps({"error": {"message": "not found"}}).encode())

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-model", daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def hosted_url(self) -> str:
        """The same server addressed as 0.0.0.0, which Linux connects to this machine but which is
        no loopback name: the box treats it as a hosted endpoint (one that needs its key)."""
        return f"http://0.0.0.0:{self.server.server_address[1]}/v1"

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

    # --- what a strict endpoint refuses ------------------------------------------------------

    def _refusal(self, body: dict[str, Any]) -> str | None:
        """Why a strict server refuses this request, or ``None``."""
        for name in sorted(self.refuses):
            if name in body:
                return f"Unrecognized request argument supplied: {name}"
        model = str(body.get("model", ""))
        if "max_tokens" in body and NEW_CAP_ONLY.match(model):
            return "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
        if "stream_options" in body and not body.get("stream"):
            return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
        problem = self._conversation_problem(body.get("messages"))
        if problem is not None:
            return problem
        for tool in body.get("tools") or []:
            if tool.get("type") != "function" or not (tool.get("function") or {}).get("name"):
                return f"invalid tool: {json.dumps(tool)[:200]}"
        if self.context_tokens is not None:
            tokens = len(json.dumps(body.get("messages", [])) + json.dumps(body.get("tools", []))) // 4
            if tokens > self.context_tokens:
                return (f"This model's maximum context length is {self.context_tokens} tokens. However, your messages "
                        f"resulted in {tokens} tokens (context length exceeded).")
            asked = body.get("max_completion_tokens", body.get("max_tokens"))
            if isinstance(asked, int) and tokens + asked > self.context_tokens:
                # As vLLM: the prompt and the output asked for must both fit the window.
                return (f"This model's maximum context length is {self.context_tokens} tokens. However, you requested "
                        f"{tokens + asked} tokens ({tokens} in the messages, {asked} in the completion). "
                        "Please reduce the length of the messages or completion.")
        return None

    @staticmethod
    def _conversation_problem(messages: Any) -> str | None:
        if not isinstance(messages, list) or not messages:
            return "'messages' must be a non-empty list"
        open_calls: set[str] = set()
        for n, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ROLES:
                return f"messages[{n}]: unknown role {role!r}"
            if role == "tool":
                call_id = message.get("tool_call_id")
                if call_id not in open_calls:
                    return f"messages[{n}]: a tool result for {call_id!r}, which the assistant message before it did not call"
                open_calls.discard(call_id)
                continue
            if open_calls:
                return f"messages[{n}]: the tool calls {sorted(open_calls)} have no results before this {role} message"
            if role == "assistant":
                if n == 0 or all(m.get("role") in ("system", "developer") for m in messages[:n]):
                    return f"messages[{n}]: an assistant message before any user message"
                for tool_call in message.get("tool_calls") or []:
                    function = tool_call.get("function") or {}
                    if not tool_call.get("id") or not function.get("name"):
                        return f"messages[{n}]: a tool call without an id or a name"
                    open_calls.add(tool_call["id"])
                if message.get("content") is None and not message.get("tool_calls"):
                    return f"messages[{n}]: an assistant message with neither content nor tool calls"
            elif not isinstance(message.get("content"), (str, list)):
                return f"messages[{n}]: a {role} message without content"
        if open_calls:
            return f"the tool calls {sorted(open_calls)} have no results"
        return None

    # --- answering ---------------------------------------------------------------------------

    def _handle(self, handler: Any, raw: bytes) -> None:
        received = Received(handler.path, {k.lower(): v for k, v in handler.headers.items()}, raw, at=time.monotonic())
        self.received.append(received)
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        refusal = self._refusal(body) if body else "the body is not JSON"
        try:
            if refusal is not None:
                self.problems.append(refusal)
                received.status = 400
                handler._send(400, json.dumps({"error": {"message": refusal, "type": "invalid_request_error"}}).encode())
            else:
                self._answer(handler, body, self._next(body), received)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
        except Cut:
            handler.close_connection = True
            handler.connection.shutdown(2)
        received.answered_at = time.monotonic()

    def _answer(self, handler: Any, body: dict[str, Any], answer: Answer, received: Received) -> None:
        if answer.delay_s:
            time.sleep(answer.delay_s)
        received.status = answer.status if answer.raw is not None or answer.status >= 400 else 200
        if answer.raw is not None:
            handler._send(answer.status, answer.raw)
        elif answer.status >= 400:
            headers = {"Retry-After": answer.retry_after} if answer.retry_after is not None else {}
            handler._send(answer.status, json.dumps({"error": {"message": answer.error or "error", "type": "fake"}}).encode(),
                          headers)
        elif body.get("stream"):
            self._stream(handler, body, answer)
        else:
            if answer.cut:
                raise Cut
            chunks = self._chunks(body, answer)
            if answer.chunk_delay_s:
                time.sleep(answer.chunk_delay_s * len(chunks))
            handler._send(200, json.dumps(self._completion(body, answer)).encode())

    def _stream(self, handler: Any, body: dict[str, Any], answer: Answer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(data: str) -> None:
            payload = f"data: {data}\n\n".encode()
            handler.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            handler.wfile.flush()

        chunks = self._chunks(body, answer)
        for n, chunk in enumerate(chunks):
            if answer.cut and n == min(3, len(chunks) - 1):
                raise Cut
            if answer.chunk_delay_s and n:
                time.sleep(answer.chunk_delay_s)
            send(json.dumps(chunk))
        if (body.get("stream_options") or {}).get("include_usage"):
            send(json.dumps({**self._envelope(body, chunks[0]["id"]), "choices": [], "usage": self._usage(answer)}))
        send("[DONE]")
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    def _new_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def _envelope(self, body: dict[str, Any], id_: str) -> dict[str, Any]:
        return {"id": id_, "object": "chat.completion.chunk", "created": int(time.time()), "model": body.get("model", "fake")}

    def _chunks(self, body: dict[str, Any], answer: Answer) -> list[dict[str, Any]]:
        """The answer as a stream: the text a few characters at a time, each tool call's id and
        name first and then its arguments in pieces, the finish reason last."""
        n = self._new_id()
        envelope = self._envelope(body, f"chatcmpl-{n}")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [chunk({"role": "assistant", "content": ""})]
        text = answer.content or ""
        out += [chunk({"content": text[i:i + 4]}) for i in range(0, len(text), 4)]
        for i, (name, arguments) in enumerate(answer.tool_calls):
            out.append(chunk({"tool_calls": [{"index": i, "id": f"call_{n}_{i}", "type": "function",
                                              "function": {"name": name, "arguments": ""}}]}))
            args = self._arguments(answer, i, arguments)
            out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 5]}}]})
                    for j in range(0, len(args), 5)]
        out.append(chunk({}, self._finish(answer)))
        return out

    @staticmethod
    def _arguments(answer: Answer, i: int, arguments: dict[str, Any] | str) -> str:
        if answer.raw_arguments is not None and i < len(answer.raw_arguments):
            return answer.raw_arguments[i]
        return arguments if isinstance(arguments, str) else json.dumps(arguments)

    @staticmethod
    def _finish(answer: Answer) -> str:
        return answer.finish_reason or ("tool_calls" if answer.tool_calls else "stop")

    @staticmethod
    def _usage(answer: Answer) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": answer.usage[0], "completion_tokens": answer.usage[1],
                                 "total_tokens": answer.usage[0] + answer.usage[1]}
        if answer.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens}
        return usage

    def _completion(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        n = self._new_id()
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": self._arguments(answer, i, args)}}
                for i, (name, args) in enumerate(answer.tool_calls)
            ]
        return {
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish(answer)}],
            "usage": self._usage(answer),
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

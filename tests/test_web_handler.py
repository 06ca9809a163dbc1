"""The web process serves requests on a few threads kept for its life (boxsite.core.handler): a
request's signals, middleware and view run on one of them, and requests at the same time run on
different ones. Each thread keeps its database connection (on PostgreSQL too: a pool checkout per
request cost a round trip and its bookkeeping)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_started
from django.db import connections
from django.db.backends.signals import connection_created

from boxsite.asgi import application, django_app
from tests.conftest import Box


async def _get(path: str, token: str) -> int:
    """One GET through the box's ASGI application, as daphne hands it over."""
    return (await _call("GET", path, [(b"authorization", f"Bearer {token}".encode())]))[0]


async def _call(method: str, path: str, headers: list[tuple[bytes, bytes]], content: bytes = b"") -> tuple[int, bytes]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("127.0.0.1", 50000), "server": ("localhost", 80),
    }
    body = [{"type": "http.request", "body": content, "more_body": False}]
    connected = asyncio.Event()  # the client stays connected until the response is sent
    statuses: list[int] = []
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await connected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
        elif message["type"] == "http.response.body":
            sent.append(message.get("body", b""))

    await application(scope, receive, send)
    return statuses[0], b"".join(sent)


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/api/tasks", "/login", "/static/js/api.js"])
async def test_a_charset_that_is_not_a_name_is_a_400_in_the_error_shape(path: str) -> None:
    status, content = await _call("POST", path, [(b"content-type", b"application/json; charset=utf-8\x00")], b"{}")
    assert status == 400, content[:300]
    assert json.loads(content) == {"code": "INVALID_REQUEST", "message": "the Content-Type's charset is not a name",
                                   "field": "Content-Type"}


@pytest.fixture
def serving_threads() -> Iterator[list[str]]:
    """The name of the thread each request started on."""
    names: list[str] = []

    def started(**kwargs: Any) -> None:
        names.append(threading.current_thread().name)

    request_started.connect(started)
    yield names
    request_started.disconnect(started)
    for lane in django_app.application.lanes:  # the test database is dropped at the end: let go of it
        lane.executor.submit(connections.close_all).result()


def test_requests_one_after_another_are_served_on_a_thread_kept_for_them(box: Box, serving_threads: list[str]) -> None:
    async def one_after_another() -> list[int]:
        return [await _get("/api/tasks", box.token) for _ in range(10)]

    assert asyncio.run(one_after_another()) == [200] * 10
    assert len(serving_threads) == 10
    assert len(set(serving_threads)) == 1, serving_threads
    assert serving_threads[0] != threading.current_thread().name


def test_requests_at_the_same_time_are_served_on_threads_of_their_own(box: Box, serving_threads: list[str]) -> None:
    async def together() -> list[int]:
        return list(await asyncio.gather(*(_get("/api/tasks", box.token) for _ in range(3))))

    assert asyncio.run(together()) == [200] * 3
    assert len(set(serving_threads)) == 3, serving_threads


def _web_process_database() -> dict[str, Any]:
    """The web process's database settings, as its settings module makes them (a process of its own)."""
    code = ("import json; from django.conf import settings; d = settings.DATABASES['default'];"
            " print(json.dumps({'CONN_MAX_AGE': d.get('CONN_MAX_AGE', 0), 'OPTIONS': d.get('OPTIONS', {})}))")
    env = {**os.environ, "BOX_WEB_PROCESS": "1", "DJANGO_SETTINGS_MODULE": "boxsite.settings"}
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(found.stdout.strip().splitlines()[-1]))


def test_a_web_thread_keeps_its_database_connection_across_requests(box: Box, serving_threads: list[str]) -> None:
    web = _web_process_database()
    assert "pool" not in web["OPTIONS"]
    assert web["CONN_MAX_AGE"] is None or web["CONN_MAX_AGE"] > 0
    opened: list[str] = []

    def created(**kwargs: Any) -> None:
        opened.append(threading.current_thread().name)

    database = connections.settings["default"]
    kept = database["CONN_MAX_AGE"]
    database["CONN_MAX_AGE"] = web["CONN_MAX_AGE"]  # the threads' connections are made from this dict
    connection_created.connect(created)
    try:
        async def one_after_another() -> list[int]:
            return [await _get("/api/tasks", box.token) for _ in range(10)]

        assert asyncio.run(one_after_another()) == [200] * 10
    finally:
        connection_created.disconnect(created)
        database["CONN_MAX_AGE"] = kept
    assert len(set(serving_threads)) == 1
    assert opened in ([], serving_threads[:1]), opened  # at most its first request opened one

"""The web process serves requests on a few threads kept for its life (boxsite.handler): a
request's signals, middleware and view run on one of them, and requests at the same time run on
different ones."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_started
from django.db import connections

from boxsite.asgi import application, django_app
from tests.conftest import Box


async def _get(path: str, token: str) -> int:
    """One GET through the box's ASGI application, as daphne hands it over."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 50000), "server": ("localhost", 80),
    }
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    connected = asyncio.Event()  # the client stays connected until the response is sent
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await connected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await application(scope, receive, send)
    return statuses[0]


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

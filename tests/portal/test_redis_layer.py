"""The live streams' Redis channel layer (boxsite.core.live_layer) over a real Redis.

A page's stream outlasts a slow Redis: a consumer waits for its next message in channels_redis's
blocking pop (5 s), and a reply that comes a moment after it must not end the consumer. redis-py
cut every read at its default socket timeout, also 5 s: the cut read's connection was closed and
the pop sent again (losing a message the cut pop had taken), and on a loaded machine, after its
retries, the idle page's stream died with ``Timeout reading from`` Redis.

A consumer's receive ends when cancelled, wherever in its pop the cancellation lands: redis-py's
send inside Python 3.11's ``wait_for`` swallowed one that came just after the send, and the
receive went on popping; with the longer read timeout nothing ended that loop, and an event
loop's close waited for it for good."""
from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from channels_redis.core import RedisChannelLayer

from boxsite.core.live_layer import LiveRedisChannelLayer
from boxsite.settings import live_layer

LATE_S = 0.5  # how late the proxy hands on each of Redis's replies


class LateRedis:
    """A TCP proxy in front of Redis that hands on Redis's replies ``LATE_S`` late, in order, and
    counts the connections made through it and the blocking pops sent through it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.connections = 0
        self.pops = 0
        self.server: asyncio.Server | None = None
        self.serving: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and end every connection, so nothing of the proxy outlives the test."""
        assert self.server is not None
        self.server.close()
        for task in self.serving:
            task.cancel()
        if self.serving:
            _, pending = await asyncio.wait(self.serving, timeout=10)
            assert not pending, "the proxy's connections did not end"

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.serving.add(task)
        self.connections += 1
        redis_reader, redis_writer = await asyncio.open_connection(*self.target)
        try:
            await asyncio.gather(self._pipe(client_reader, redis_writer, late=False),
                                 self._pipe(redis_reader, client_writer, late=True), return_exceptions=True)
        finally:
            client_writer.close()
            redis_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, late: bool) -> None:
        while data := await reader.read(65536):
            if late:
                await asyncio.sleep(LATE_S)  # the fault itself: a reply held back, not a wait on the test's outcome
            else:
                self.pops += data.upper().count(b"BZPOPMIN")
            writer.write(data)
            await writer.drain()
        writer.close()


@pytest.fixture
def redis_url() -> str:
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("set REDIS_URL to run the live streams over channels_redis")
    return url


def run_alone(scenario: Coroutine[Any, Any, None]) -> None:
    """Run ``scenario`` on an event loop of its own and close the loop within a deadline: a task
    of the libraries that does not end when cancelled fails the test instead of hanging it."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario, timeout=60))
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            _, pending = loop.run_until_complete(asyncio.wait(left, timeout=10))
            assert not pending, f"tasks that did not end when cancelled: {pending}"
        loop.close()


def test_a_consumer_waiting_for_its_next_message_outlasts_a_late_empty_reply(redis_url: str) -> None:
    run_alone(_outlasts_a_late_empty_reply(redis_url))


async def _outlasts_a_late_empty_reply(redis_url: str) -> None:
    parts = urlsplit(redis_url)
    proxy = LateRedis(parts.hostname or "127.0.0.1", parts.port or 6379)
    port = await proxy.start()
    prefix = f"box-test-late-{uuid.uuid4().hex[:8]}"
    consumer_layer = LiveRedisChannelLayer(**live_layer(urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}")), prefix=prefix)["CONFIG"])
    sender_layer = LiveRedisChannelLayer(**live_layer(redis_url, prefix=prefix)["CONFIG"])
    channel = await consumer_layer.new_channel()
    receiving = asyncio.create_task(consumer_layer.receive(channel))
    try:
        deadline = asyncio.get_running_loop().time() + 3 * RedisChannelLayer.brpop_timeout
        while proxy.pops < 2:  # the first blocking pop timed out in Redis, its empty reply came late, and it went on
            assert not receiving.done(), f"the consumer's wait ended: {receiving.exception()!r}"
            assert asyncio.get_running_loop().time() < deadline, "no blocking pop came back empty"
            await asyncio.wait({receiving}, timeout=0.05)

        await sender_layer.send(channel, {"type": "event.new", "seq": 7})
        message = await asyncio.wait_for(receiving, timeout=3 * RedisChannelLayer.brpop_timeout)
        assert message == {"type": "event.new", "seq": 7}, "the consumer still gets its next message"
        assert proxy.connections == 1, "the late reply was read on the consumer's one connection, not cut and sent again"
    finally:
        receiving.cancel()
        await asyncio.gather(receiving, return_exceptions=True)
        await sender_layer.flush()
        await sender_layer.close_pools()
        await consumer_layer.close_pools()
        await proxy.close()


CANCEL_TURNS = 60  # loop turns after a receive starts at which it is cancelled, one receive each
ENDS_WITHIN_S = 2.0  # a cancelled receive ends at once; one that swallowed it pops on for good


def test_a_receive_ends_when_cancelled_wherever_in_its_pop_the_cancellation_lands(redis_url: str) -> None:
    run_alone(_ends_when_cancelled(redis_url))


async def _ends_when_cancelled(redis_url: str) -> None:
    layer = LiveRedisChannelLayer(**live_layer(redis_url, prefix=f"box-test-cancel-{uuid.uuid4().hex[:8]}")["CONFIG"])
    channel = await layer.new_channel()
    try:
        await layer.send(channel, {"type": "warm.up"})  # the pool's connection is made before the sweep
        assert await layer.receive(channel) == {"type": "warm.up"}
        # A receive sends two commands (the backup's clean-up, then the pop) within its first
        # loop turns; cancelling after each count of turns lands once on every step of them.
        for turns in range(CANCEL_TURNS):
            receiving = asyncio.create_task(layer.receive(channel))
            for _ in range(turns):
                await asyncio.sleep(0)  # one loop turn: the step the cancellation lands on, not a wait
            receiving.cancel()
            done, _ = await asyncio.wait({receiving}, timeout=ENDS_WITHIN_S)
            assert done, f"a receive cancelled {turns} loop turns after it started did not end"
            assert receiving.cancelled(), f"it ended otherwise: {receiving.exception()!r}"
        await layer.send(channel, {"type": "event.new", "seq": 8})
        message = await asyncio.wait_for(layer.receive(channel), timeout=3 * RedisChannelLayer.brpop_timeout)
        assert message == {"type": "event.new", "seq": 8}, "the layer still delivers after the cancelled receives"
    finally:
        await layer.flush()
        await layer.close_pools()

"""Live notifications over Redis go out through one long-lived connection per process, and still
arrive: a fresh event loop and Redis connection per event cost 10-20 ms each. The caller does not
wait for Redis; what it queued goes out in order, a group's wake-ups queued together as one."""
from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from boxsite.settings import live_layer
from tasks.events import owner_group, publish_event, task_group, wait_published


@pytest.fixture
def redis_layer(settings: Any) -> Any:
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("set REDIS_URL to run the publisher over channels_redis")
    name = f"box-test-publisher-{uuid.uuid4().hex[:8]}"
    # its connections named, to tell them from the other test workers' on the same database
    settings.CHANNEL_LAYERS = {"default": live_layer(url, prefix=name, client_name=name)}
    return get_channel_layer()


def _layer_connections(client: redis.Redis) -> set[int]:
    """Ids of the Redis connections the test's channel layer has open (named after its prefix)."""
    name = get_channel_layer().prefix
    return {int(c["id"]) for c in client.client_list() if c.get("name") == name}


def test_events_are_published_through_one_connection_that_stays_open(redis_layer: Any) -> None:
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    channel = async_to_sync(redis_layer.new_channel)()
    async_to_sync(redis_layer.group_add)(task_group("pubtest"), channel)
    before = _layer_connections(client)

    publish_event("pubtest", 1, 1, 1, "note")
    assert wait_published()
    first = _layer_connections(client) - before
    for seq in range(2, 12):
        publish_event("pubtest", 1, seq, seq, "note")
        assert wait_published()
    after = _layer_connections(client) - before

    assert len(first) == 1, "the first publish opens the process's one publisher connection"
    assert after == first, "later publishes reuse it rather than opening their own"
    received = async_to_sync(_receive)(redis_layer, channel, 11)
    async_to_sync(redis_layer.group_discard)(task_group("pubtest"), channel)
    assert received == list(range(1, 12)), "every event arrives, in order"


def test_a_burst_of_events_ends_with_a_wake_up_for_its_last_event_in_each_group(redis_layer: Any) -> None:
    task_channel, owner_channel = async_to_sync(redis_layer.new_channel)(), async_to_sync(redis_layer.new_channel)()
    async_to_sync(redis_layer.group_add)(task_group("burst"), task_channel)
    async_to_sync(redis_layer.group_add)(owner_group(7), owner_channel)
    for seq in range(1, 51):
        publish_event("burst", 7, seq, seq, "step")
    assert wait_published()
    received_by = {channel: async_to_sync(_receive_all)(redis_layer, channel) for channel in (task_channel, owner_channel)}
    async_to_sync(redis_layer.group_discard)(task_group("burst"), task_channel)
    async_to_sync(redis_layer.group_discard)(owner_group(7), owner_channel)
    for channel, kind in ((task_channel, "event.new"), (owner_channel, "task.changed")):
        received = received_by[channel]
        assert [m["type"] for m in received] == [kind] * len(received)
        seqs = [m["seq"] for m in received]
        assert seqs == sorted(seqs) and seqs[-1] == 50, "in order, the last one last"
        assert len(seqs) < 50, "wake-ups queued while a batch went out were sent as one"


async def _receive(layer: Any, channel: str, count: int) -> list[int]:
    return [(await layer.receive(channel))["seq"] for _ in range(count)]


async def _receive_all(layer: Any, channel: str) -> list[dict[str, Any]]:
    """Every message waiting on ``channel`` (it waits 0.5 s for one more)."""
    found = []
    while True:
        try:
            found.append(await asyncio.wait_for(layer.receive(channel), 0.5))
        except TimeoutError:
            return found


def test_a_group_nobody_is_in_is_not_sent_to_and_a_watched_one_is(redis_layer: Any, monkeypatch: Any) -> None:
    # group_send costs two Redis round trips per group even when nobody is in it (most groups,
    # while no page is open); the batch's groups are looked up together first.
    sent: list[str] = []
    group_send = redis_layer.group_send

    async def counted(group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await group_send(group, message)

    monkeypatch.setattr(redis_layer, "group_send", counted)
    channel = async_to_sync(redis_layer.new_channel)()
    async_to_sync(redis_layer.group_add)(task_group("watched"), channel)
    publish_event("unwatched", 8, 1, 1, "note")
    publish_event("watched", 8, 2, 2, "note")
    assert wait_published()
    received = async_to_sync(_receive_all)(redis_layer, channel)
    async_to_sync(redis_layer.group_discard)(task_group("watched"), channel)
    assert sent == [task_group("watched")]
    assert [m["seq"] for m in received] == [2]

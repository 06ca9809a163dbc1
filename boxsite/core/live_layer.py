"""The Redis channel layer of the live streams: channels_redis's, on connections that keep a
cancellation.

A consumer waits for its next message in channels_redis's receive, a loop of blocking pops that
ends only with a message, an error or a cancellation; channels cancels it when the page goes away,
and an event loop's close cancels every task left. redis-py sends each command inside
``asyncio.wait_for`` when it has a socket timeout, and Python 3.11's ``wait_for`` returns normally
when the cancellation comes after the send finished but before the waiting task woke up (a
cancel that lands while a receive starts its pop often does): the cancellation is gone, and the
receive goes on popping. With a read timeout above the pop, as the live streams need, nothing
else ends that loop, and an event loop's close waits for it for good. The connections here raise
the swallowed cancellation again (docs/internals/decisions-isolation.md#portal-phone-and-live-streams).
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.asyncio.connection import AbstractConnection, ConnectionPool


class _KeepsCancellation(AbstractConnection):
    """Mixed in before a redis-py connection class."""

    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)
        if task is not None and task.cancelling() > asked:
            # Cancelled during the send, yet no CancelledError came out of it: wait_for swallowed
            # it. The command's reply will never be read, so the connection cannot serve another.
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError


_keeping: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def keeping_cancellation(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """``connection_class`` (plain, TLS, Unix socket or Sentinel) with ``_KeepsCancellation``."""
    if connection_class not in _keeping:
        _keeping[connection_class] = type(f"CancellationKeeping{connection_class.__name__}", (_KeepsCancellation, connection_class), {})
    return _keeping[connection_class]


class LiveRedisChannelLayer(RedisChannelLayer):
    def create_pool(self, index: int) -> Any:
        pool: ConnectionPool = super().create_pool(index)
        pool.connection_class = keeping_cancellation(pool.connection_class)
        return pool

"""The action log's write path and the one publisher.

``record_event`` is the only code that creates ``TaskEvent`` rows and the only caller of the
redaction function on the write path. ``publish_*`` run after commit and only notify: the
database stays the source of truth, and consumers re-read from it. Notifications go out through
one long-lived event loop per process (``_Publisher``), so the channel layer's Redis connection
is made once, not once per event.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.sql import UpdateQuery

from tasks.facts import Redactor, redactor_for
from tasks.models import Task, TaskEvent

log = logging.getLogger(__name__)

MAX_SUMMARY = 2000
PUBLISH_TIMEOUT_S = 5.0  # a notification Redis cannot take in this long is dropped (clients catch up)


class _Publisher:
    """This process's one event loop for live notifications, run on its own daemon thread.

    The channel layer keeps a Redis connection pool per event loop; ``async_to_sync`` made a fresh
    loop (and so a fresh connection) per call. A forked child (a django-q2 worker) does not have
    its parent's thread, so it starts its own loop on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="box-publisher", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` on the publisher's loop and wait for it (so errors reach the caller)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())
        try:
            future.result(timeout=PUBLISH_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise


_publisher = _Publisher()


def task_group(task_id: str) -> str:
    return f"task.{task_id}"


def owner_group(owner_id: int) -> str:
    return f"tasks.owner.{owner_id}"


def record_event(
    task: Task,
    kind: str,
    summary: str,
    data: dict[str, Any] | None = None,
    *,
    cost_cents: int = 0,
    artifacts: list[Any] | None = None,
    redactor: Redactor | None = None,
    seq: int | None = None,
) -> TaskEvent:
    """Append one event to ``task``'s log. Call inside the transaction that made the change.
    ``seq``: the number the change's own update already took (``numbered_update``)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_event must run inside the transaction that made the change")
    redact = redactor or redactor_for(task)
    if seq is None:
        seq = _next_seq(task.pk)
    event = TaskEvent.objects.create(
        task_id=task.pk,
        seq=seq,
        kind=kind,
        summary=redact.text(summary)[:MAX_SUMMARY],
        data=redact.redact(data or {}),
        cost_cents=cost_cents,
        artifacts=redact.redact(artifacts or []),
    )
    task.event_seq = seq
    owner_id = task.owner_id
    transaction.on_commit(lambda: publish_event(task.pk, owner_id, event.pk, seq, kind))
    return event


def _next_seq(task_id: str) -> int:
    """The task's next event number. The UPDATE takes the task row's lock until commit, so
    concurrent writers get consecutive numbers and a rolled-back writer leaves no gap; RETURNING
    (PostgreSQL, SQLite 3.35+) reads the number in the same statement."""
    connection = transaction.get_connection()
    if not connection.features.can_return_rows_from_bulk_insert:  # pragma: no cover - a database without RETURNING
        Task.objects.filter(pk=task_id).update(event_seq=F("event_seq") + 1)
        return Task.objects.filter(pk=task_id).values_list("event_seq", flat=True).get()
    quote = connection.ops.quote_name
    table, key, column = quote(Task._meta.db_table), quote(Task._meta.pk.column), quote(Task._meta.get_field("event_seq").column)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = {column} + 1 WHERE {key} = %s RETURNING {column}", [task_id])
        row = cursor.fetchone()
    if row is None:
        raise Task.DoesNotExist(f"no task '{task_id}'")
    return int(row[0])


def numbered_update(rows: QuerySet[Task], events: int = 1, /, **values: Any) -> int | None:
    """``rows.update(**values)`` that also takes the task's next event number, in one statement:
    the number of the event that records the change, or None when no row matched (nothing was
    written). ``rows`` selects one task. ``events`` > 1: that many numbers are taken, the first
    returned (the change's event, then those recorded with it)."""
    connection = transaction.get_connection()
    if not connection.features.can_return_rows_from_bulk_insert:  # pragma: no cover - a database without RETURNING
        if rows.update(**values) != 1:
            return None
        task_id = rows.values_list("pk", flat=True).get()
        first = _next_seq(task_id)
        for _ in range(events - 1):
            _next_seq(task_id)
        return first
    query: UpdateQuery = rows.query.chain(UpdateQuery)  # type: ignore[assignment]  # as QuerySet.update builds it
    query.add_update_values({**values, "event_seq": F("event_seq") + events})
    statement, params = query.get_compiler(rows.db).as_sql()
    column = connection.ops.quote_name(Task._meta.get_field("event_seq").column)
    with connection.cursor() as cursor:
        cursor.execute(f"{statement} RETURNING {column}", params)
        found = cursor.fetchall()
    if len(found) != 1:
        return None
    return int(found[0][0]) - events + 1


def publish_event(task_id: str, owner_id: int, event_id: int, seq: int, kind: str) -> None:
    """Tell live consumers that ``task_id`` has a new event. A no-op without a channel layer
    (embedded mode, where consumers poll the event table)."""

    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "event.new", "task": task_id, "id": event_id, "seq": seq, "kind": kind}

    async def send_both() -> None:
        await layer.group_send(task_group(task_id), message)
        await layer.group_send(owner_group(owner_id), {**message, "type": "task.changed"})

    try:
        _publisher.run(send_both())
    except Exception:  # noqa: BLE001 - a lost notification is recovered by the client's seq cursor
        log.warning("live notification for %s seq %s failed; clients catch up from the log", task_id, seq, exc_info=True)

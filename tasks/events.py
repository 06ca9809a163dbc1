"""The action log's write path and the one publisher.

``record_event`` creates ``TaskEvent`` rows and calls the redaction function on the write path;
``record_numbered_event`` (a worker's step) and ``tasks.moves.write`` (a task's move) do the same
in statements built once, for the hottest paths. ``publish_*`` run after commit and only notify: the
database stays the source of truth, and consumers re-read from it. Notifications go out through
one long-lived event loop per process (``_Publisher``), so the channel layer's Redis connection
is made once, not once per event.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import defaultdict
from typing import Any

from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.sql import InsertQuery, UpdateQuery

from tasks import runs
from tasks.facts import Redactor, redactor_for
from tasks.models import Task, TaskEvent

log = logging.getLogger(__name__)

MAX_SUMMARY = 2000
PUBLISH_TIMEOUT_S = 5.0  # a notification Redis cannot take in this long is dropped (clients catch up)


class _Publisher:
    """This process's one event loop for live notifications, run on its own daemon thread.

    The channel layer keeps a Redis connection pool per event loop; ``async_to_sync`` made a fresh
    loop (and so a fresh connection) per call. A caller hands its notification over and goes on
    (a flow step's thread used to wait for six Redis round trips per event); the loop's thread
    sends what is queued in order. A notification is only a wake-up (consumers re-read from their
    cursor), so of those queued for one group while the previous batch went out only the last is
    sent: it goes out after every event it stands for has committed. A forked child (a django-q2
    worker) does not have its parent's thread: it starts its own loop and queue on first use."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued: dict[str, dict[str, Any]] = {}  # group -> its newest message, in first-queued order
        self._sending = False

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="box-publisher", daemon=True).start()
            self._loop = loop
        return self._loop

    def send(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        """Queue ``sends`` (group, message), in order; they go out on the loop's thread."""
        with self._lock:
            for group, message in sends:
                self._queued.pop(group, None)  # its newer message goes to the end: order is kept
                self._queued[group] = message
            if self._sending:
                return  # the running batch takes these next
            self._sending = True
            loop = self._running_loop()
        asyncio.run_coroutine_threadsafe(self._send_queued(), loop)

    async def _send_queued(self) -> None:
        while True:
            with self._lock:
                batch, self._queued = self._queued, {}
                if not batch:
                    self._sending = False  # under the lock that ``send`` checks it with
                    self._idle.notify_all()
                    return
            try:
                try:
                    await asyncio.wait_for(_send_batch(batch), PUBLISH_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - a lost wake-up is recovered by the client's cursor and safety poll
                    log.warning("live notifications to %s failed; clients catch up from the log", list(batch), exc_info=True)
            except BaseException:  # cancelled (the loop stopping): the next send starts a batch again
                with self._lock:
                    self._sending = False
                    self._idle.notify_all()
                raise

    def wait_sent(self, timeout: float = PUBLISH_TIMEOUT_S) -> bool:
        """Wait until everything queued so far went out (tests, and a process about to end)."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._sending, timeout)


async def _send_batch(batch: dict[str, dict[str, Any]]) -> None:
    """Send each group its message, skipping the groups nobody is in (most, while no page is open)."""
    layer = get_channel_layer()
    watched = await _watched(layer, list(batch))
    for group, message in batch.items():
        if group not in watched:
            continue
        try:
            await layer.group_send(group, message)
        except Exception:  # noqa: BLE001 - a lost wake-up is recovered by the client's cursor and safety poll
            log.warning("live notification to %s failed; clients catch up from the log", group, exc_info=True)


async def _watched(layer: Any, groups: list[str]) -> set[str]:
    """The groups with a member: one pipelined round trip per Redis server for the whole batch,
    where ``group_send`` takes two for each group (its expiry sweep and its members' read), and
    a consumer's group is there while its page is open. A member past the group's expiry still
    counts: ``group_send`` then sweeps it out."""
    if not isinstance(layer, RedisChannelLayer):
        return set(groups)
    by_server: dict[int, list[str]] = defaultdict(list)
    for group in groups:
        by_server[layer.consistent_hash(group)].append(group)
    watched: set[str] = set()
    for index, named in by_server.items():
        pipe = layer.connection(index).pipeline(transaction=False)
        for group in named:
            pipe.exists(layer._group_key(group))
        watched.update(group for group, found in zip(named, await pipe.execute(), strict=True) if found)
    return watched


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

    if get_channel_layer() is None:
        return
    message = {"type": "event.new", "task": task_id, "id": event_id, "seq": seq, "kind": kind}
    _publisher.send([(task_group(task_id), message), (owner_group(owner_id), {**message, "type": "task.changed"})])


def wait_published(timeout: float = PUBLISH_TIMEOUT_S) -> bool:
    """Wait until this process's notifications queued so far went out; False on a timeout."""
    return _publisher.wait_sent(timeout)


def record_numbered_event(rows: QuerySet[Task], values: dict[str, Any], task: Task, kind: str, summary: str,
                          data: dict[str, Any] | None = None, *, cost_cents: int = 0, artifacts: list[Any] | None = None,
                          redactor: Redactor, lease: tuple[int, str] | None = None) -> TaskEvent | None:
    """``numbered_update(rows, **values)`` and ``record_event`` of the event that records it, at its
    number; one statement on PostgreSQL (a data-modifying ``WITH``: the task row is updated, and
    so held, before the event is inserted), two elsewhere. Call inside the transaction of the change.
    ``Task.DoesNotExist`` when ``rows`` matched nothing (nothing was written).

    ``lease`` (run id, token): the run's lease is proven (and extended, ``runs.holds_lease``) after
    the row is held; None when it is gone, and the caller undoes the transaction. On PostgreSQL the
    lease's update is part of the same statement, made to wait for the task row's update by reading
    it (the one lock order: the task row before its run's), so it costs no round trip of its own;
    each row's update sees the row's last committed version, so a lease taken over meanwhile fails."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        seq = numbered_update(rows, **values)
        if seq is None:
            raise Task.DoesNotExist(f"no task '{task.pk}'")
        recorded = record_event(task, kind, summary, data, cost_cents=cost_cents, artifacts=artifacts, redactor=redactor, seq=seq)
        return recorded if lease is None or runs.holds_lease(*lease) else None
    if not connection.in_atomic_block:
        raise RuntimeError("record_numbered_event must run inside the transaction that made the change")
    event = TaskEvent(task_id=task.pk, seq=0, kind=kind, summary=redactor.text(summary)[:MAX_SUMMARY],
                      data=redactor.redact(data or {}), cost_cents=cost_cents, artifacts=redactor.redact(artifacts or []))
    update: UpdateQuery = rows.query.chain(UpdateQuery)  # type: ignore[assignment]  # as QuerySet.update builds it
    update.add_update_values({**values, "event_seq": F("event_seq") + 1})
    update_sql, update_params = update.get_compiler(rows.db).as_sql()
    fields = [f for f in TaskEvent._meta.local_concrete_fields if not f.primary_key]
    insert = InsertQuery(TaskEvent)
    insert.insert_values(fields, [event])
    compiler = insert.get_compiler(rows.db)
    prepared = [compiler.prepare_value(field, compiler.pre_save_val(field, event)) for field in fields]
    placeholder_rows, param_rows = compiler.assemble_as_sql(fields, [prepared])
    quote = connection.ops.quote_name
    number = quote(Task._meta.get_field("event_seq").column)
    columns, selected, params = [], [], list(update_params)
    for field, placeholder, param in zip(fields, placeholder_rows[0], param_rows[0], strict=True):
        columns.append(quote(field.column))
        if field.name == "seq":
            selected.append(f"moved.{number}")
        else:
            selected.append(placeholder)
            params.append(param)
    insert_sql = (f"INSERT INTO {quote(TaskEvent._meta.db_table)} ({', '.join(columns)}) SELECT {', '.join(selected)} FROM moved "
                  f"RETURNING {quote(TaskEvent._meta.pk.column)}, {quote(TaskEvent._meta.get_field('seq').column)}")
    if lease is None:
        sql = f"WITH moved AS ({update_sql} RETURNING {number}) {insert_sql}"
    else:
        lease_sql, lease_params = runs.lease_statement(*lease)
        sql = (f"WITH moved AS ({update_sql} RETURNING {number}), "
               f"leased AS ({lease_sql} AND EXISTS (SELECT 1 FROM moved) RETURNING 1), "
               f"added AS ({insert_sql}) SELECT added.*, EXISTS (SELECT 1 FROM leased) FROM added")
        params = [*update_params, *lease_params, *params[len(update_params):]]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    if len(found) != 1:
        raise Task.DoesNotExist(f"no task '{task.pk}'")
    if lease is not None and not found[0][2]:
        return None
    event.pk, event.seq = found[0][:2]
    event._state.adding, event._state.db = False, rows.db
    seq, owner_id = event.seq, task.owner_id
    task.event_seq = seq
    transaction.on_commit(lambda: publish_event(task.pk, owner_id, event.pk, seq, kind))
    return event

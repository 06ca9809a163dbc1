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
import functools
import logging
import os
import threading
from collections import defaultdict
from typing import Any

from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import OperationalError, connection, transaction
from django.db.models import F, Field, QuerySet
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from boxsite.core.db.rows import column
from tasks.models import Task, TaskEvent
from tasks.run import leases as runs
from tasks.vault.facts import Redactor, redactor_for

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


def record_numbered_event(task: Task, values: dict[str, Any], kind: str, summary: str, data: dict[str, Any] | None = None,
                          *, cost_cents: int = 0, artifacts: list[Any] | None = None, redactor: Redactor,
                          lease: tuple[int, str], seen: dict[str, Any] | None = None,
                          alone: bool = False) -> TaskEvent | None:
    """A worker's write to its task's row (``values``, plain; ``cost_cents`` added to the task's)
    and the event that records it, at the number the write takes, proving the run's ``lease``
    (run id, token: ``runs.holds_lease``, which extends it). ``seen``: written only if those
    fields of the row are still so. None when the lease is gone (nothing written, the caller
    undoes the transaction); ``Task.DoesNotExist`` when the row did not match (nothing written).

    On PostgreSQL one statement written once per process (the ORM built the update and the insert
    at every step), which writes nothing unless the lease holds: it locks the task's row, then
    proves the lease on the run's (the one lock order, and each row read as last committed once
    held, so a lease taken over meanwhile fails), and only then updates the task and inserts the
    event. So it is atomic alone: ``alone``, sent outside a transaction (``StepRecorder.event``),
    it does not wait for the task's row (``RowHeld`` when another transaction holds it: nothing
    written), so it never waits for a lock with its commit already asked for; a worker that dies
    while its write waits in a transaction has it undone, as before. Elsewhere the update, the
    insert and the lease's proof, inside the caller's transaction."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        written = {**values, "cost_cents": F("cost_cents") + cost_cents} if cost_cents else values
        seq = numbered_update(Task.objects.filter(pk=task.pk, **(seen or {})), **written)
        if seq is None:
            raise Task.DoesNotExist(f"no task '{task.pk}'")
        recorded = record_event(task, kind, summary, data, cost_cents=cost_cents, artifacts=artifacts, redactor=redactor, seq=seq)
        return recorded if runs.holds_lease(*lease) else None
    now = timezone.now()
    event = TaskEvent(task_id=task.pk, seq=0, kind=kind, summary=redactor.text(summary)[:MAX_SUMMARY],
                      data=redactor.redact(data or {}), cost_cents=cost_cents, artifacts=redactor.redact(artifacts or []),
                      created_at=now)
    seen = seen or {}
    params: list[Any] = [task.pk, *runs.lease_statement(*lease)[1]]
    params += [_field(Task, name).get_db_prep_save(value, connection=connection) for name, value in values.items()]
    params += [cost_cents] if cost_cents else []
    params += [task.pk, *(_field(Task, name).get_db_prep_save(value, connection=connection) for name, value in seen.items())]
    params += [_field(TaskEvent, name).get_db_prep_save(getattr(event, _field(TaskEvent, name).attname), connection=connection)
               for name in EVENT_FIELDS]
    try:
        with connection.cursor() as cursor:
            cursor.execute(_step_statement(connection.vendor, tuple(values), bool(cost_cents), tuple(seen), alone), params)
            held, event_id, seq = cursor.fetchone()
    except OperationalError as exc:
        if alone and getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise RowHeld(f"task '{task.pk}' is held by another transaction") from exc
        raise
    if not held:
        return None
    if event_id is None:
        raise Task.DoesNotExist(f"no task '{task.pk}' as this run last wrote it")
    event.pk, event.seq = event_id, seq
    event._state.adding, event._state.db = False, connection.alias
    owner_id = task.owner_id
    task.event_seq = seq
    transaction.on_commit(lambda: publish_event(task.pk, owner_id, event_id, seq, kind))
    return event


class RowHeld(Exception):
    """A write sent alone found its task's row held by another transaction (``record_numbered_event``)."""


LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's answer to NOWAIT when the row is locked
# The columns a hand-written event insert fills, in the statements' order (here and in tasks.moves);
# its number, ``seq``, is the update's, not a parameter.
EVENT_FIELDS = ("task", "kind", "summary", "data", "cost_cents", "artifacts", "created_at")


def _field(model: type[Task] | type[TaskEvent], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete
    return field


@functools.cache
def _step_statement(vendor: str, names: tuple[str, ...], adds_cost: bool, seen: tuple[str, ...], alone: bool) -> str:
    """``record_numbered_event``'s statement (PostgreSQL): the task's row locked, the lease proven
    on the run's row once the task's is held, the task's update only if the lease held (and the
    row is as ``seen``), the event's insert at the number it took. Every part reads the one
    before it, which orders them (PostgreSQL runs a ``WITH``'s parts as their readers need them).
    The row: whether the lease held, then the event's id and number (none when nothing matched).
    ``alone``: the task's row is not waited for (``NOWAIT``)."""
    quote = connection.ops.quote_name
    table, pk, number = quote(Task._meta.db_table), quote(column(Task, "id")), quote(column(Task, "event_seq"))
    sets = [f"{quote(column(Task, name))} = %s" for name in names]
    if adds_cost:
        cost = quote(column(Task, "cost_cents"))
        sets.append(f"{cost} = {cost} + %s")
    sets.append(f"{number} = {number} + 1")
    conditions = "".join(f" AND {quote(column(Task, name))} = %s" for name in seen)
    events, event_pk, event_seq = quote(TaskEvent._meta.db_table), quote(column(TaskEvent, "id")), quote(column(TaskEvent, "seq"))
    columns = ", ".join(quote(column(TaskEvent, name)) for name in (EVENT_FIELDS[0], "seq", *EVENT_FIELDS[1:]))
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    return (f"WITH locked AS (SELECT 1 FROM {table} WHERE {pk} = %s FOR UPDATE{' NOWAIT' if alone else ''}), "
            f"leased AS ({runs.heartbeat_statement(vendor)} AND EXISTS (SELECT 1 FROM locked) RETURNING 1), "
            f"moved AS (UPDATE {table} SET {', '.join(sets)} WHERE {pk} = %s{conditions} "
            f"AND EXISTS (SELECT 1 FROM leased) RETURNING {number}), "
            f"added AS (INSERT INTO {events} ({columns}) SELECT %s, moved.{number}, {rest} FROM moved "
            f"RETURNING {event_pk}, {event_seq}) "
            f"SELECT EXISTS (SELECT 1 FROM leased), added.{event_pk}, added.{event_seq} FROM (SELECT 1) AS asked "
            f"LEFT JOIN added ON TRUE")


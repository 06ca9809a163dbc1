"""A task's move (``services._try_write_task``) and the events that record it, in statements
written once per process, where the ORM built the update and each event's insert at every move
(2-3 ms of CPU a move, two moves per trivial run; issue 19).

The statements do what the ORM's did: the update is conditional on the (state, version) the
caller saw, bumps ``version``, writes ``updated_at`` and the fields, and takes the events' numbers
(``event_seq``) in the same statement (``events.numbered_update``); each event is inserted at its
number, redacted, and published after commit (``events.record_event``). On PostgreSQL the update
and the inserts are one statement (data-modifying ``WITH``: the task row is updated, and so held,
before the events are inserted); on SQLite the update, then one insert per event.

A held-back task's release (``services._release_if_ready``, inside its dependency's final move)
is written the same way: the note that it may start and its first run (``release``).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Field

from boxsite.core.db.rows import column
from tasks.events import EVENT_FIELDS, MAX_SUMMARY, publish_event
from tasks.models import EventKind, Run, RunKind, Task, TaskEvent
from tasks.run import leases as runs
from tasks.vault.facts import Redactor

Event = tuple[str, str, dict[str, Any]]  # kind, summary, data: as ``record_event`` takes them


def can_write(fields: dict[str, Any]) -> bool:
    """Whether ``write`` takes ``fields``: plain values of the task's own columns, and a database
    that returns rows from an update (else the caller goes through the ORM)."""
    return bool(connection.features.can_return_rows_from_bulk_insert) and all(
        not hasattr(value, "resolve_expression") and not hasattr(value, "prepare_database_save") for value in fields.values())


def write(task: Task, now: datetime, fields: dict[str, Any], events: Sequence[Event], *, redactor: Redactor) -> bool:
    """Move ``task`` if it is still at the state and version it has in memory: write ``fields``,
    ``version`` + 1 and ``updated_at`` = ``now``, and append ``events`` at the next numbers. False
    when it moved on (nothing was written). Updates ``task`` in memory as the ORM's path did.
    Call inside the transaction of the change (``can_write(fields)`` first)."""
    if not connection.in_atomic_block:
        raise RuntimeError("a move must be written inside its transaction")
    names = tuple(fields)
    update_params = [_task_field(name).get_db_prep_save(value, connection=connection) for name, value in fields.items()]
    adapt_now = _task_field("updated_at").get_db_prep_save(now, connection=connection)
    update_params += [adapt_now, task.pk, task.state, task.version]
    rows = []
    for kind, summary, data in events:
        values = {"task": task.pk, "kind": kind, "summary": redactor.text(summary)[:MAX_SUMMARY],
                  "data": redactor.redact(data), "cost_cents": 0, "artifacts": [], "created_at": now}
        rows.append([_event_field(name).get_db_prep_save(values[name], connection=connection) for name in EVENT_FIELDS])
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_moved_and_recorded(connection.vendor, names, len(events)),
                           [*update_params, *(param for row in rows for param in row)])
            found = cursor.fetchall()
        if len(found) != 1:
            return False
        last, ids = int(found[0][0]), [int(pk) for pk in found[0][1:]]
    else:
        statement, insert = _moved(connection.vendor, names, len(events))
        with connection.cursor() as cursor:
            cursor.execute(statement, update_params)
            found = cursor.fetchall()
            if len(found) != 1:
                return False
            last, ids = int(found[0][0]), []
            for number, row in enumerate(rows, start=last - len(events) + 1):
                cursor.execute(insert, [*row[:1], number, *row[1:]])
                ids.append(int(cursor.fetchone()[0]))
    task.version += 1
    task.updated_at = now
    for key, value in fields.items():
        setattr(task, key, value)
    task.event_seq = last
    owner_id = task.owner_id
    for number, event_id, (kind, _summary, _data) in zip(range(last - len(events) + 1, last + 1), ids, events, strict=True):
        transaction.on_commit(functools.partial(publish_event, task.pk, owner_id, event_id, number, kind))
    return True


def _task_field(name: str) -> Field[Any, Any]:
    field = Task._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete
    return field


def _event_field(name: str) -> Field[Any, Any]:
    field = TaskEvent._meta.get_field(name)
    assert isinstance(field, Field)
    return field


def _update(names: tuple[str, ...], events: int) -> str:
    quote = connection.ops.quote_name
    version, updated, number, pk, state = (quote(column(Task, name)) for name in ("version", "updated_at", "event_seq", "id", "state"))
    sets = [f"{quote(column(Task, name))} = %s" for name in names]
    sets += [f"{version} = {version} + 1", f"{updated} = %s", f"{number} = {number} + {events}"]
    return (f"UPDATE {quote(Task._meta.db_table)} SET {', '.join(sets)} "
            f"WHERE {pk} = %s AND {state} = %s AND {version} = %s RETURNING {number}")


def _event_columns() -> tuple[str, str]:
    """The event table and its columns: the task's, the number's, then the rest of ``EVENT_FIELDS``."""
    quote = connection.ops.quote_name
    names = [EVENT_FIELDS[0], "seq", *EVENT_FIELDS[1:]]
    return quote(TaskEvent._meta.db_table), ", ".join(quote(column(TaskEvent, name)) for name in names)


@functools.cache
def _moved(vendor: str, names: tuple[str, ...], events: int) -> tuple[str, str]:
    """The update, and the insert of one event at its number (SQLite)."""
    table, columns = _event_columns()
    insert = (f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * (len(EVENT_FIELDS) + 1))}) "
              f"RETURNING {connection.ops.quote_name(column(TaskEvent, 'id'))}")
    return _update(names, events), insert


@functools.cache
def _moved_and_recorded(vendor: str, names: tuple[str, ...], events: int) -> str:
    """The update and the inserts in one statement (PostgreSQL). Each insert after the first
    reads the one before it, so the events' ids come in the order of their numbers."""
    quote = connection.ops.quote_name
    table, columns = _event_columns()
    number, pk = quote(column(Task, "event_seq")), quote(column(TaskEvent, "id"))
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    parts = [f"moved AS ({_update(names, events)})"]
    for index in range(events):
        after = f", recorded_{index - 1}" if index else ""
        parts.append(f"recorded_{index} AS (INSERT INTO {table} ({columns}) "
                     f"SELECT %s, moved.{number} - {events - 1 - index}, {rest} FROM moved{after} RETURNING {pk})")
    ids = ", ".join(f"recorded_{index}.{pk}" for index in range(events))
    joined = ", ".join(f"recorded_{index}" for index in range(events))
    return f"WITH {', '.join(parts)} SELECT moved.{number}, {ids} FROM moved, {joined}"


def release(task: Task, now: datetime, summary: str, data: dict[str, Any], *, redactor: Redactor) -> int:
    """A held-back task may start: its note (``summary``, ``data``) at the next number and its
    first run, a ``start`` due now and written as sent, as ``runs.create_run`` writes it (the next
    number of the task's runs). One statement on PostgreSQL, three on SQLite, written once. The
    run is sent and the event published after commit. Call inside the transaction that holds the
    task's row and decided it (``services._release_if_ready``): every run of a task is made under
    its row's lock, so the runs' numbers read here are all there are. The run's id."""
    if not connection.in_atomic_block:
        raise RuntimeError("a release must be written inside its transaction")
    event = [_event_field(name).get_db_prep_save(value, connection=connection) for name, value in (
        ("task", task.pk), ("kind", EventKind.NOTE), ("summary", redactor.text(summary)[:MAX_SUMMARY]),
        ("data", redactor.redact(data)), ("cost_cents", 0), ("artifacts", []), ("created_at", now))]
    run = Run(task_id=task.pk, number=0, kind=RunKind.START, resume={}, available_at=now, enqueued_at=now)
    fields = _run_fields()
    started = [field.get_db_prep_save(field.pre_save(run, add=True), connection=connection) for field in fields]
    started.append(task.pk)  # whose runs' last number is read
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_released(connection.vendor), [task.pk, *event, *started])
            seq, event_id, run_id = cursor.fetchone()
    else:
        numbered, noted, queued = _released_apart(connection.vendor)
        with connection.cursor() as cursor:
            cursor.execute(numbered, [task.pk])
            (seq,) = cursor.fetchone()
            cursor.execute(noted, [*event[:1], seq, *event[1:]])
            (event_id,) = cursor.fetchone()
            cursor.execute(queued, started)
            (run_id,) = cursor.fetchone()
    task.event_seq = seq
    transaction.on_commit(functools.partial(publish_event, task.pk, task.owner_id, event_id, seq, EventKind.NOTE))
    runs.send_after_commit(int(run_id))
    return int(run_id)


def _run_fields() -> list[Field[Any, Any]]:
    """The run's columns the insert writes, its task's first (the number is read, not written)."""
    fields = [f for f in Run._meta.concrete_fields if isinstance(f, Field) and not f.primary_key and f.name != "number"]
    return sorted(fields, key=lambda f: f.name != "task")


def _run_insert() -> str:
    """The run's insert, numbered after the task's last run: ``INSERT … SELECT … FROM run``, an
    aggregate without ``GROUP BY`` (one row, also when the task has no run yet)."""
    quote = connection.ops.quote_name
    fields = _run_fields()
    table, number, task = quote(Run._meta.db_table), quote(column(Run, "number")), quote(column(Run, "task"))
    rest = ", ".join(quote(column(Run, f.name)) for f in fields[1:])
    values = ", ".join(["%s"] * (len(fields) - 1))
    return (f"INSERT INTO {table} ({task}, {number}, {rest}) "
            f"SELECT %s, COALESCE(MAX({number}), 0) + 1, {values} FROM {table} WHERE {task} = %s "
            f"RETURNING {quote(column(Run, 'id'))}")


@functools.cache
def _released(vendor: str) -> str:
    """The note's number, its insert and the run's insert in one statement (PostgreSQL)."""
    quote = connection.ops.quote_name
    table, columns = _event_columns()
    number, pk, event_pk = quote(column(Task, "event_seq")), quote(column(Task, "id")), quote(column(TaskEvent, "id"))
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    return (f"WITH numbered AS (UPDATE {quote(Task._meta.db_table)} SET {number} = {number} + 1 WHERE {pk} = %s "
            f"RETURNING {number}), "
            f"noted AS (INSERT INTO {table} ({columns}) SELECT %s, numbered.{number}, {rest} FROM numbered RETURNING {event_pk}), "
            f"queued AS ({_run_insert()}) "
            f"SELECT numbered.{number}, noted.{event_pk}, queued.{quote(column(Run, 'id'))} FROM numbered, noted, queued")


@functools.cache
def _released_apart(vendor: str) -> tuple[str, str, str]:
    """The note's number, its insert and the run's insert (SQLite)."""
    quote = connection.ops.quote_name
    number, pk = quote(column(Task, "event_seq")), quote(column(Task, "id"))
    numbered = f"UPDATE {quote(Task._meta.db_table)} SET {number} = {number} + 1 WHERE {pk} = %s RETURNING {number}"
    return numbered, _moved(vendor, (), 1)[1], _run_insert()

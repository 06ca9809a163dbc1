"""A task's move (``services._try_write_task``) and the events that record it, in statements
written once per process, where the ORM built the update and each event's insert at every move
(2-3 ms of CPU a move, two moves per trivial run; issue 19).

The statements do what the ORM's did: the update is conditional on the (state, version) the
caller saw, bumps ``version``, writes ``updated_at`` and the fields, and takes the events' numbers
(``event_seq``) in the same statement (``events.numbered_update``); each event is inserted at its
number, redacted, and published after commit (``events.record_event``). On PostgreSQL the update
and the inserts are one statement (data-modifying ``WITH``: the task row is updated, and so held,
before the events are inserted); on SQLite the update, then one insert per event.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Field

from boxsite.db.rows import column
from tasks.events import MAX_SUMMARY, publish_event
from tasks.facts import Redactor
from tasks.models import Task, TaskEvent

Event = tuple[str, str, dict[str, Any]]  # kind, summary, data: as ``record_event`` takes them
# The event's columns in the statements' order; its number is the update's (``seq``), not a parameter.
_EVENT_FIELDS = ("task", "kind", "summary", "data", "cost_cents", "artifacts", "created_at")


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
        rows.append([_event_field(name).get_db_prep_save(values[name], connection=connection) for name in _EVENT_FIELDS])
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
    """The event table and its columns: the task's, the number's, then the rest of ``_EVENT_FIELDS``."""
    quote = connection.ops.quote_name
    names = [_EVENT_FIELDS[0], "seq", *_EVENT_FIELDS[1:]]
    return quote(TaskEvent._meta.db_table), ", ".join(quote(column(TaskEvent, name)) for name in names)


@functools.cache
def _moved(vendor: str, names: tuple[str, ...], events: int) -> tuple[str, str]:
    """The update, and the insert of one event at its number (SQLite)."""
    table, columns = _event_columns()
    insert = (f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * (len(_EVENT_FIELDS) + 1))}) "
              f"RETURNING {connection.ops.quote_name(column(TaskEvent, 'id'))}")
    return _update(names, events), insert


@functools.cache
def _moved_and_recorded(vendor: str, names: tuple[str, ...], events: int) -> str:
    """The update and the inserts in one statement (PostgreSQL). Each insert after the first
    reads the one before it, so the events' ids come in the order of their numbers."""
    quote = connection.ops.quote_name
    table, columns = _event_columns()
    number, pk = quote(column(Task, "event_seq")), quote(column(TaskEvent, "id"))
    rest = ", ".join(["%s"] * (len(_EVENT_FIELDS) - 1))
    parts = [f"moved AS ({_update(names, events)})"]
    for index in range(events):
        after = f", recorded_{index - 1}" if index else ""
        parts.append(f"recorded_{index} AS (INSERT INTO {table} ({columns}) "
                     f"SELECT %s, moved.{number} - {events - 1 - index}, {rest} FROM moved{after} RETURNING {pk})")
    ids = ", ".join(f"recorded_{index}.{pk}" for index in range(events))
    joined = ", ".join(f"recorded_{index}" for index in range(events))
    return f"WITH {', '.join(parts)} SELECT moved.{number}, {ids} FROM moved, {joined}"

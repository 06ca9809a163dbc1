"""A task's move and its events: the move with its events, a held-back task's release, the
events' numbers, a worker's step."""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import F, Field, QuerySet
from django.db.models.sql import UpdateQuery

from tasks.models import Run, Task, TaskEvent
from tasks.sql.base import EVENT_FIELDS, col, event_columns, event_row, field_of, prepared, table_of
from tasks.sql.runs import lease_params, lease_update

# --- a task's move and its events -------------------------------------------------------------

class Moved(NamedTuple):
    last: int  # the task's event number after the move: its events' are the last ``len(ids)``
    ids: list[int]  # the events' ids, in the order of their numbers


def move_task(task_id: str, state: str, version: int, values: Mapping[str, Any], now: datetime,
              events: Sequence[Mapping[str, Any]]) -> Moved | None:
    """The task's move, written once: ``values``, ``version`` + 1 and ``updated_at`` = ``now``,
    only while it is at (``state``, ``version``), and ``events`` (``EVENT_FIELDS`` each, redacted)
    inserted at the numbers the update takes. None when it moved on (nothing was written).
    PostgreSQL: one statement; SQLite: the update, then one insert per event."""
    params = [*prepared(Task, values), field_of(Task, "updated_at").get_db_prep_save(now, connection=connection),
              task_id, state, version]
    rows = [event_row(event) for event in events]
    names = tuple(values)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_moved_and_recorded(connection.vendor, names, len(rows)), [*params, *(p for row in rows for p in row)])
            found = cursor.fetchall()
            if len(found) != 1:
                return None
            return Moved(int(found[0][0]), [int(pk) for pk in found[0][1:]])
        statement, insert = _moved(connection.vendor, names, len(rows))
        cursor.execute(statement, params)
        found = cursor.fetchall()
        if len(found) != 1:
            return None
        last, ids = int(found[0][0]), []
        for number, row in enumerate(rows, start=last - len(rows) + 1):
            cursor.execute(insert, [*row[:1], number, *row[1:]])
            ids.append(int(cursor.fetchone()[0]))
    return Moved(last, ids)


def _update(names: tuple[str, ...], events: int) -> str:
    version, updated, number, pk, state = (col(Task, name) for name in ("version", "updated_at", "event_seq", "id", "state"))
    sets = [f"{col(Task, name)} = %s" for name in names]
    sets += [f"{version} = {version} + 1", f"{updated} = %s", f"{number} = {number} + {events}"]
    return (f"UPDATE {table_of(Task)} SET {', '.join(sets)} "
            f"WHERE {pk} = %s AND {state} = %s AND {version} = %s RETURNING {number}")


@functools.cache
def _moved(vendor: str, names: tuple[str, ...], events: int) -> tuple[str, str]:
    """The update, and the insert of one event at its number (SQLite)."""
    table, columns = event_columns()
    insert = (f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * (len(EVENT_FIELDS) + 1))}) "
              f"RETURNING {col(TaskEvent, 'id')}")
    return _update(names, events), insert


@functools.cache
def _moved_and_recorded(vendor: str, names: tuple[str, ...], events: int) -> str:
    """The update and the inserts in one statement (PostgreSQL): the task row is updated, and so
    held, first; each insert after the first reads the one before it, so the events' ids come in
    the order of their numbers."""
    table, columns = event_columns()
    number, pk = col(Task, "event_seq"), col(TaskEvent, "id")
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    parts = [f"moved AS ({_update(names, events)})"]
    for index in range(events):
        after = f", recorded_{index - 1}" if index else ""
        parts.append(f"recorded_{index} AS (INSERT INTO {table} ({columns}) "
                     f"SELECT %s, moved.{number} - {events - 1 - index}, {rest} FROM moved{after} RETURNING {pk})")
    ids = ", ".join(f"recorded_{index}.{pk}" for index in range(events))
    joined = "".join(f", recorded_{index}" for index in range(events))
    return f"WITH {', '.join(parts)} SELECT moved.{number}{', ' if ids else ''}{ids} FROM moved{joined}"


class Released(NamedTuple):
    seq: int  # the note's number
    event_id: int
    run_id: int


def release_held(task_id: str, note: Mapping[str, Any], run: Run) -> Released:
    """A held-back task's release, written once: its ``note`` (``EVENT_FIELDS``, redacted) at the
    next number and ``run`` inserted numbered after the task's last run. One statement on
    PostgreSQL, three on SQLite. Call under the task row's lock (every run of a task is made
    under it, so the numbers read are all there are)."""
    event = event_row(note)
    fields = _run_fields()
    started = [field.get_db_prep_save(field.pre_save(run, add=True), connection=connection) for field in fields]
    started.append(task_id)  # whose runs' last number is read
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_released(connection.vendor), [task_id, *event, *started])
            seq, event_id, run_id = cursor.fetchone()
            return Released(int(seq), int(event_id), int(run_id))
        numbered, noted, queued = _released_apart(connection.vendor)
        cursor.execute(numbered, [task_id])
        (seq,) = cursor.fetchone()
        cursor.execute(noted, [*event[:1], seq, *event[1:]])
        (event_id,) = cursor.fetchone()
        cursor.execute(queued, started)
        (run_id,) = cursor.fetchone()
    return Released(int(seq), int(event_id), int(run_id))


def _run_fields() -> list[Field[Any, Any]]:
    """The run's columns the insert writes, its task's first (the number is read, not written)."""
    fields = [f for f in Run._meta.concrete_fields if isinstance(f, Field) and not f.primary_key and f.name != "number"]
    return sorted(fields, key=lambda f: f.name != "task")


def _run_insert() -> str:
    """The run's insert, numbered after the task's last run: an aggregate without ``GROUP BY``
    (one row, also when the task has no run yet)."""
    fields = _run_fields()
    table, number, task = table_of(Run), col(Run, "number"), col(Run, "task")
    rest = ", ".join(col(Run, f.name) for f in fields[1:])
    values = ", ".join(["%s"] * (len(fields) - 1))
    return (f"INSERT INTO {table} ({task}, {number}, {rest}) "
            f"SELECT %s, COALESCE(MAX({number}), 0) + 1, {values} FROM {table} WHERE {task} = %s "
            f"RETURNING {col(Run, 'id')}")


def _numbered() -> str:
    number, pk = col(Task, "event_seq"), col(Task, "id")
    return f"UPDATE {table_of(Task)} SET {number} = {number} + 1 WHERE {pk} = %s RETURNING {number}"


@functools.cache
def _released(vendor: str) -> str:
    """The note's number, its insert and the run's insert in one statement (PostgreSQL)."""
    table, columns = event_columns()
    number, event_pk = col(Task, "event_seq"), col(TaskEvent, "id")
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    return (f"WITH numbered AS ({_numbered()}), "
            f"noted AS (INSERT INTO {table} ({columns}) SELECT %s, numbered.{number}, {rest} FROM numbered RETURNING {event_pk}), "
            f"queued AS ({_run_insert()}) "
            f"SELECT numbered.{number}, noted.{event_pk}, queued.{col(Run, 'id')} FROM numbered, noted, queued")


@functools.cache
def _released_apart(vendor: str) -> tuple[str, str, str]:
    """The note's number, its insert and the run's insert (SQLite)."""
    return _numbered(), _moved(vendor, (), 1)[1], _run_insert()


def next_event_number(task_id: str) -> int | None:
    """The task's next event number, taken by an update that holds its row until commit (so
    writers get consecutive numbers); None when there is no such task."""
    with connection.cursor() as cursor:
        cursor.execute(_numbered(), [task_id])
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def numbered_update(rows: QuerySet[Task], events: int = 1, /, **values: Any) -> int | None:
    """``rows.update(**values)`` that takes ``events`` event numbers in the same statement (the
    ORM's update with ``RETURNING``, which it cannot add): the first number, or None when no row
    matched (nothing was written)."""
    query: UpdateQuery = rows.query.chain(UpdateQuery)  # type: ignore[assignment]  # as QuerySet.update builds it
    query.add_update_values({**values, "event_seq": F("event_seq") + events})
    statement, params = query.get_compiler(rows.db).as_sql()
    with connection.cursor() as cursor:
        cursor.execute(f"{statement} RETURNING {col(Task, 'event_seq')}", params)
        found = cursor.fetchall()
    if len(found) != 1:
        return None
    return int(found[0][0]) - events + 1


class Step(NamedTuple):
    held: bool  # whether the lease held
    event_id: int | None  # None when the task's row did not match (nothing written)
    seq: int | None


def record_step(task_id: str, lease: tuple[int, str], lease_until: tuple[datetime, datetime], values: Mapping[str, Any],
                cost_cents: int, seen: Mapping[str, Any], event: Mapping[str, Any], *, alone: bool) -> Step:
    """A worker's write to its task's row and the event recording it, in one statement that
    writes nothing unless the run's ``lease`` (run id, token) holds, extended to ``lease_until``
    (now, expiry) (PostgreSQL). ``alone``: the task's row is not waited for (``NOWAIT``)."""
    params: list[Any] = [task_id, *lease_params(*lease, *lease_until), *prepared(Task, values)]
    params += [cost_cents] if cost_cents else []
    params += [task_id, *prepared(Task, seen), *event_row(event)]
    with connection.cursor() as cursor:
        cursor.execute(_step(connection.vendor, tuple(values), bool(cost_cents), tuple(seen), alone), params)
        held, event_id, seq = cursor.fetchone()
    return Step(bool(held), event_id, seq)


@functools.cache
def _step(vendor: str, names: tuple[str, ...], adds_cost: bool, seen: tuple[str, ...], alone: bool) -> str:
    """The task's row locked, the lease proven on the run's once the task's is held, the task's
    update only if the lease held (and the row is as ``seen``), the event's insert at the number
    it took. Every part reads the one before it, which orders them. The row: whether the lease
    held, then the event's id and number (none when nothing matched)."""
    table, pk, number = table_of(Task), col(Task, "id"), col(Task, "event_seq")
    sets = [f"{col(Task, name)} = %s" for name in names]
    if adds_cost:
        cost = col(Task, "cost_cents")
        sets.append(f"{cost} = {cost} + %s")
    sets.append(f"{number} = {number} + 1")
    conditions = "".join(f" AND {col(Task, name)} = %s" for name in seen)
    events, columns = event_columns()
    event_pk, event_seq = col(TaskEvent, "id"), col(TaskEvent, "seq")
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    return (f"WITH locked AS (SELECT 1 FROM {table} WHERE {pk} = %s FOR UPDATE{' NOWAIT' if alone else ''}), "
            f"leased AS ({lease_update(vendor)} AND EXISTS (SELECT 1 FROM locked) RETURNING 1), "
            f"moved AS (UPDATE {table} SET {', '.join(sets)} WHERE {pk} = %s{conditions} "
            f"AND EXISTS (SELECT 1 FROM leased) RETURNING {number}), "
            f"added AS (INSERT INTO {events} ({columns}) SELECT %s, moved.{number}, {rest} FROM moved "
            f"RETURNING {event_pk}, {event_seq}) "
            f"SELECT EXISTS (SELECT 1 FROM leased), added.{event_pk}, added.{event_seq} FROM (SELECT 1) AS asked "
            f"LEFT JOIN added ON TRUE")

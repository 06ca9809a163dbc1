"""Every hand-written statement of the tasks app, one named function each.

They serve the paths every run, move or request takes, where the ORM would build the same
statement again at each call: each is written once per process and database (``functools.cache``
on the vendor), quoted through the connection, for SQLite and PostgreSQL. A function takes plain
values, prepares them as the model's fields do, and returns what the statement found; what the
rows mean, the locks' order and the side effects after commit are its caller's.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Field, Model, QuerySet
from django.db.models.sql import UpdateQuery
from django.db.models.sql.subqueries import InsertQuery
from django_q.models import OrmQ

from boxsite.core.db.rows import Rows, column
from tasks.models import Dependency, Layer, Run, RunState, Task, TaskEvent, VaultSecret, Workspace
from tasks.states import ACTIVE, State

# An event's columns in the statements' order; its number is the update's, not a parameter.
EVENT_FIELDS = ("task", "kind", "summary", "data", "cost_cents", "artifacts", "created_at")


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def _col(model: type[Model], name: str) -> str:
    return _quote(column(model, name))


def _table(model: type[Model]) -> str:
    return _quote(model._meta.db_table)


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete
    return field


def _prepared(model: type[Model], values: Mapping[str, Any]) -> list[Any]:
    return [_field(model, name).get_db_prep_save(value, connection=connection) for name, value in values.items()]


def _event_row(event: Mapping[str, Any]) -> list[Any]:
    return [_field(TaskEvent, name).get_db_prep_save(event[name], connection=connection) for name in EVENT_FIELDS]


def _event_columns() -> tuple[str, str]:
    """The event table and its columns: the task's, the number's, then the rest of ``EVENT_FIELDS``."""
    names = [EVENT_FIELDS[0], "seq", *EVENT_FIELDS[1:]]
    return _table(TaskEvent), ", ".join(_col(TaskEvent, name) for name in names)


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
    params = [*_prepared(Task, values), _field(Task, "updated_at").get_db_prep_save(now, connection=connection),
              task_id, state, version]
    rows = [_event_row(event) for event in events]
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
    version, updated, number, pk, state = (_col(Task, name) for name in ("version", "updated_at", "event_seq", "id", "state"))
    sets = [f"{_col(Task, name)} = %s" for name in names]
    sets += [f"{version} = {version} + 1", f"{updated} = %s", f"{number} = {number} + {events}"]
    return (f"UPDATE {_table(Task)} SET {', '.join(sets)} "
            f"WHERE {pk} = %s AND {state} = %s AND {version} = %s RETURNING {number}")


@functools.cache
def _moved(vendor: str, names: tuple[str, ...], events: int) -> tuple[str, str]:
    """The update, and the insert of one event at its number (SQLite)."""
    table, columns = _event_columns()
    insert = (f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * (len(EVENT_FIELDS) + 1))}) "
              f"RETURNING {_col(TaskEvent, 'id')}")
    return _update(names, events), insert


@functools.cache
def _moved_and_recorded(vendor: str, names: tuple[str, ...], events: int) -> str:
    """The update and the inserts in one statement (PostgreSQL): the task row is updated, and so
    held, first; each insert after the first reads the one before it, so the events' ids come in
    the order of their numbers."""
    table, columns = _event_columns()
    number, pk = _col(Task, "event_seq"), _col(TaskEvent, "id")
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
    event = _event_row(note)
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
    table, number, task = _table(Run), _col(Run, "number"), _col(Run, "task")
    rest = ", ".join(_col(Run, f.name) for f in fields[1:])
    values = ", ".join(["%s"] * (len(fields) - 1))
    return (f"INSERT INTO {table} ({task}, {number}, {rest}) "
            f"SELECT %s, COALESCE(MAX({number}), 0) + 1, {values} FROM {table} WHERE {task} = %s "
            f"RETURNING {_col(Run, 'id')}")


def _numbered() -> str:
    number, pk = _col(Task, "event_seq"), _col(Task, "id")
    return f"UPDATE {_table(Task)} SET {number} = {number} + 1 WHERE {pk} = %s RETURNING {number}"


@functools.cache
def _released(vendor: str) -> str:
    """The note's number, its insert and the run's insert in one statement (PostgreSQL)."""
    table, columns = _event_columns()
    number, event_pk = _col(Task, "event_seq"), _col(TaskEvent, "id")
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    return (f"WITH numbered AS ({_numbered()}), "
            f"noted AS (INSERT INTO {table} ({columns}) SELECT %s, numbered.{number}, {rest} FROM numbered RETURNING {event_pk}), "
            f"queued AS ({_run_insert()}) "
            f"SELECT numbered.{number}, noted.{event_pk}, queued.{_col(Run, 'id')} FROM numbered, noted, queued")


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
        cursor.execute(f"{statement} RETURNING {_col(Task, 'event_seq')}", params)
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
    params: list[Any] = [task_id, *_lease_params(*lease, *lease_until), *_prepared(Task, values)]
    params += [cost_cents] if cost_cents else []
    params += [task_id, *_prepared(Task, seen), *_event_row(event)]
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
    table, pk, number = _table(Task), _col(Task, "id"), _col(Task, "event_seq")
    sets = [f"{_col(Task, name)} = %s" for name in names]
    if adds_cost:
        cost = _col(Task, "cost_cents")
        sets.append(f"{cost} = {cost} + %s")
    sets.append(f"{number} = {number} + 1")
    conditions = "".join(f" AND {_col(Task, name)} = %s" for name in seen)
    events, columns = _event_columns()
    event_pk, event_seq = _col(TaskEvent, "id"), _col(TaskEvent, "seq")
    rest = ", ".join(["%s"] * (len(EVENT_FIELDS) - 1))
    return (f"WITH locked AS (SELECT 1 FROM {table} WHERE {pk} = %s FOR UPDATE{' NOWAIT' if alone else ''}), "
            f"leased AS ({_lease(vendor)} AND EXISTS (SELECT 1 FROM locked) RETURNING 1), "
            f"moved AS (UPDATE {table} SET {', '.join(sets)} WHERE {pk} = %s{conditions} "
            f"AND EXISTS (SELECT 1 FROM leased) RETURNING {number}), "
            f"added AS (INSERT INTO {events} ({columns}) SELECT %s, moved.{number}, {rest} FROM moved "
            f"RETURNING {event_pk}, {event_seq}) "
            f"SELECT EXISTS (SELECT 1 FROM leased), added.{event_pk}, added.{event_seq} FROM (SELECT 1) AS asked "
            f"LEFT JOIN added ON TRUE")


# --- reads of a task ----------------------------------------------------------------------------

def owned_task(task_id: str, owner_id: int) -> Task | None:
    """The task if ``owner_id`` owns it: each view of a task asks once."""
    statement, rows = _owned_task(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(statement, [task_id, owner_id])
        row = cursor.fetchone()
    if row is None:
        return None
    (task,) = rows.instances(row)
    assert isinstance(task, Task)
    return task


@functools.cache
def _owned_task(vendor: str) -> tuple[str, Rows]:
    rows = Rows.of(Task)
    return f"SELECT {rows.columns()} FROM {_table(Task)} WHERE {_col(Task, 'id')} = %s AND {_col(Task, 'owner')} = %s", rows


def locked_task(task_id: str) -> Task | None:
    """Every column of the task, its row locked for the rest of the transaction (where the
    database has row locks): each run's finish reads its task again."""
    statement, rows = _locked_task(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(statement, [task_id])
        row = cursor.fetchone()
    if row is None:
        return None
    (task,) = rows.instances(row)
    assert isinstance(task, Task)
    return task


@functools.cache
def _locked_task(vendor: str) -> tuple[str, Rows]:
    rows = Rows.of(Task)
    statement = f"SELECT {rows.columns()} FROM {_table(Task)} WHERE {_col(Task, 'id')} = %s"
    return statement + (" FOR UPDATE" if connection.features.has_select_for_update else ""), rows


def active_task_count() -> int:
    """The tasks that count against the box's limit: active ones, less an ask parked for a plan
    (it holds no worker). Every creation asks."""
    with connection.cursor() as cursor:
        cursor.execute(_active_count(connection.vendor), [*(s.value for s in sorted(ACTIVE)), State.WAITING.value, "plan"])
        (active,) = cursor.fetchone()
    return int(active)


@functools.cache
def _active_count(vendor: str) -> str:
    state, waiting_for = _col(Task, "state"), _col(Task, "waiting_for")
    return (f"SELECT COUNT(*) FROM {_table(Task)} WHERE {state} IN ({', '.join(['%s'] * len(ACTIVE))}) "
            f"AND NOT ({state} = %s AND {waiting_for} = %s)")


# --- runs and leases ------------------------------------------------------------------------------

def task_of_queued_run(run_id: int) -> str | None:
    """The task of run ``run_id`` while the run is queued, the task's row locked for the rest of
    the transaction (where the database has row locks): one statement for the read and the lock."""
    with connection.cursor() as cursor:
        cursor.execute(_task_of_queued(connection.vendor), [run_id, RunState.QUEUED.value])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


@functools.cache
def _task_of_queued(vendor: str) -> str:
    of_run = f"SELECT {_col(Run, 'task')} FROM {_table(Run)} WHERE {_col(Run, 'id')} = %s AND {_col(Run, 'state')} = %s"
    if not connection.features.has_select_for_update:
        return of_run  # SQLite: BEGIN IMMEDIATE holds the one write lock already
    task_pk = _col(Task, "id")
    return f"SELECT {task_pk} FROM {_table(Task)} WHERE {task_pk} = ({of_run}) FOR UPDATE"


class Claimed(NamedTuple):
    run: Run  # with its task, and the task with its workspace
    others_running: bool  # another run of the task is running


_TAKEN = ("state", "lease_token", "lease_expires_at", "heartbeat_at", "started_at", "worker_host", "worker_pid")


def claim_run(run_id: int, token: str, now: datetime, expires: datetime, host: str, pid: int) -> Claimed | None:
    """Take run ``run_id`` if it is still queued, with a fresh lease, and read it with its task,
    the task's workspace and whether another run of the task is running: a claim at every run.
    None when it was taken already."""
    adapt = connection.ops.adapt_datetimefield_value
    taking = [RunState.RUNNING.value, token, adapt(expires), adapt(now), adapt(now), host, pid, run_id, RunState.QUEUED.value]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            statement, rows = _taken(connection.vendor)
            cursor.execute(statement, [*taking, RunState.RUNNING.value])
        else:
            cursor.execute(_take(connection.vendor), taking)
            if cursor.rowcount != 1:
                return None
            statement, rows = _claimed(connection.vendor)
            cursor.execute(statement, [RunState.RUNNING.value, run_id])
        row = cursor.fetchone()
    if row is None:
        return None
    run, task, workspace = rows.instances(row[:-1])
    assert isinstance(run, Run) and isinstance(task, Task) and isinstance(workspace, Workspace)
    run.task, task.workspace = task, workspace
    return Claimed(run, bool(row[-1]))


@functools.cache
def _take(vendor: str) -> str:
    """The claim's update, conditional on the run still being queued."""
    sets = ", ".join(f"{_col(Run, name)} = %s" for name in _TAKEN)
    return f"UPDATE {_table(Run)} SET {sets} WHERE {_col(Run, 'id')} = %s AND {_col(Run, 'state')} = %s"


def _joined_task_and_workspace(source: str) -> str:
    task, workspace = _table(Task), _table(Workspace)
    return (f"INNER JOIN {task} ON {source}.{_col(Run, 'task')} = {task}.{_col(Task, 'id')} "
            f"INNER JOIN {workspace} ON {task}.{_col(Task, 'workspace')} = {workspace}.{_col(Workspace, 'id')}")


def _others_running(run: str) -> str:
    """Whether a run of ``run``'s task other than it is running."""
    other, task, state, pk = _quote("other_run"), _col(Run, "task"), _col(Run, "state"), _col(Run, "id")
    return (f"EXISTS (SELECT 1 FROM {_table(Run)} {other} WHERE {other}.{task} = {run}.{task} "
            f"AND {other}.{state} = %s AND {other}.{pk} <> {run}.{pk})")


@functools.cache
def _taken(vendor: str) -> tuple[str, Rows]:
    """The claim's update and ``_claimed``'s read in one statement (PostgreSQL): the run as the
    update left it, its task and workspace, whether another run is running (read as before the
    update, which only moves this run)."""
    rows = Rows.of(Run, Task, Workspace)
    taken = _quote("taken")
    run_columns = [_col(Run, field.name) for field in Run._meta.concrete_fields]
    statement = (f"WITH {taken} AS ({_take(vendor)} RETURNING {', '.join(run_columns)}) "
                 f"SELECT {', '.join(f'{taken}.{name}' for name in run_columns)}, {Rows.of(Task, Workspace).columns()}, "
                 f"{_others_running(taken)} FROM {taken} {_joined_task_and_workspace(taken)}")
    return statement, rows


@functools.cache
def _claimed(vendor: str) -> tuple[str, Rows]:
    """The claimed run with its task, the task's workspace (the run's view opens on it), and
    whether another run of the task is running (SQLite)."""
    rows = Rows.of(Run, Task, Workspace)
    run = _table(Run)
    return (f"SELECT {rows.columns()}, {_others_running(run)} FROM {run} {_joined_task_and_workspace(run)} "
            f"WHERE {run}.{_col(Run, 'id')} = %s"), rows


def extend_lease(run_id: int, token: str, now: datetime, expires: datetime) -> bool:
    """Extend the run's lease to ``expires`` if it still holds it: every guarded write of a run
    proves its lease with this. False when the lease is gone."""
    with connection.cursor() as cursor:
        cursor.execute(_lease(connection.vendor), _lease_params(run_id, token, now, expires))
        return cursor.rowcount == 1


@functools.cache
def _lease(vendor: str) -> str:
    beat, expires, pk, state, token = (_col(Run, name) for name in ("heartbeat_at", "lease_expires_at", "id", "state", "lease_token"))
    return f"UPDATE {_table(Run)} SET {beat} = %s, {expires} = %s WHERE {pk} = %s AND {state} = %s AND {token} = %s"


def _lease_params(run_id: int, token: str, now: datetime, expires: datetime) -> list[Any]:
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(now), adapt(expires), run_id, RunState.RUNNING.value, token]


def finish_run(run_id: int, token: str, outcome: str, error: str, finished_at: datetime, charged: bool) -> bool:
    """Close the run with its outcome if it still holds its lease (so it proves the lease too):
    every run's end. False when nothing was written."""
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_finish(connection.vendor), [RunState.FINISHED.value, outcome, error, adapt(finished_at), charged,
                                                    run_id, RunState.RUNNING.value, token])
        return cursor.rowcount == 1


@functools.cache
def _finish(vendor: str) -> str:
    state, outcome, error, finished, charged, pk, token = (_col(Run, name) for name in (
        "state", "outcome", "error", "finished_at", "charged", "id", "lease_token"))
    return (f"UPDATE {_table(Run)} SET {state} = %s, {outcome} = %s, {error} = %s, {finished} = %s, "
            f"{charged} = %s WHERE {pk} = %s AND {state} = %s AND {token} = %s")


def cancel_open_runs(task_id: str, finished_at: datetime) -> None:
    """Close every queued or running run of the task: every final move does."""
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_cancel_open(connection.vendor), [RunState.CANCELLED.value, adapt(finished_at), "cancelled", task_id,
                                                         RunState.QUEUED.value, RunState.RUNNING.value])


@functools.cache
def _cancel_open(vendor: str) -> str:
    state, token, finished, outcome, of_task = (_col(Run, name) for name in ("state", "lease_token", "finished_at", "outcome", "task"))
    return (f"UPDATE {_table(Run)} SET {state} = %s, {token} = '', {finished} = %s, {outcome} = %s "
            f"WHERE {of_task} = %s AND {state} IN (%s, %s)")


# --- the embedded queue (django-q2's table, in the database of its ``orm`` setting) --------------

def due_jobs(db: BaseDatabaseWrapper, list_key: str, now: datetime, limit: int) -> list[tuple[Any, Any, Any]]:
    """(id, payload, lock) of up to ``limit`` jobs of the queue not locked past ``now``: the
    pusher's read, once or twice per job."""
    with db.cursor() as cursor:
        cursor.execute(_queue(db.alias)[0], [list_key, db.ops.adapt_datetimefield_value(now), limit])
        return list(cursor.fetchall())


def take_job(db: BaseDatabaseWrapper, job_id: Any, lock: Any, until: datetime) -> bool:
    """Lock the job until ``until`` if its lock is still ``lock``: another cluster may have taken it."""
    with db.cursor() as cursor:
        cursor.execute(_queue(db.alias)[1], [db.ops.adapt_datetimefield_value(until), job_id, lock])
        return cursor.rowcount == 1


def delete_job(db: BaseDatabaseWrapper, job_id: Any) -> None:
    """A job's acknowledgement: a plain delete (the ORM's looks for related rows first)."""
    with db.cursor() as cursor:
        cursor.execute(_queue(db.alias)[2], [job_id])


@functools.cache
def _queue(alias: str) -> tuple[str, str, str]:
    """The pusher's read of due jobs, its conditional take of one, and a job's deletion."""
    quote = connections[alias].ops.quote_name
    table = quote(OrmQ._meta.db_table)
    pk, key, payload, lock = (quote(column(OrmQ, name)) for name in ("id", "key", "payload", "lock"))
    return (f"SELECT {pk}, {payload}, {lock} FROM {table} WHERE {key} = %s AND {lock} < %s LIMIT %s",
            f"UPDATE {table} SET {lock} = %s WHERE {pk} = %s AND {lock} = %s",
            f"DELETE FROM {table} WHERE {pk} = %s")


# --- dependencies -------------------------------------------------------------------------------

def held_queued(task_id: str, *, skip_locked: bool) -> Task | None:
    """The task if it is queued, only the columns a release reads (the others when first used);
    where there are row locks, its owner's row and its own locked, skipping either held elsewhere
    (``skip_locked``; None then): a dependency's final move decides its dependents."""
    statement, rows = _held_queued(connection.vendor, skip_locked)
    with connection.cursor() as cursor:
        cursor.execute(statement, [task_id, State.QUEUED.value])
        row = cursor.fetchone()
    if row is None:
        return None
    (task,) = rows.instances(row)
    assert isinstance(task, Task)
    return task


@functools.cache
def _held_queued(vendor: str, skip_locked: bool) -> tuple[str, Rows]:
    rows = Rows.only(Task, ("id", "owner", "facts", "secret_facts"))
    task = _table(Task)
    where = f"WHERE {task}.{_col(Task, 'id')} = %s AND {task}.{_col(Task, 'state')} = %s"
    if not connection.features.has_select_for_update:
        return f"SELECT {rows.columns()} FROM {task} {where}", rows
    assert skip_locked, "a wait for both locks is two statements, in the lock order (services._held_if_queued)"
    owner_model = get_user_model()
    owner = _table(owner_model)
    return (f"SELECT {rows.columns()} FROM {task} INNER JOIN {owner} ON "
            f"{owner}.{_col(owner_model, owner_model._meta.pk.name)} = {task}.{_col(Task, 'owner')} "
            f"{where} FOR UPDATE OF {owner}, {task} SKIP LOCKED"), rows


class Edges(NamedTuple):
    started: bool  # the task has a queued or running run
    edges: list[tuple[Dependency, str]]  # each edge (its own columns) and its dependency's state, in the order made


def edges_of(task_id: str) -> Edges:
    """Whether the task has an open run, and its edges with their dependencies' states, in one
    statement: every dependent's decision reads them."""
    statement, rows = _edges(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(statement, [task_id, RunState.QUEUED.value, RunState.RUNNING.value, task_id])
        found = cursor.fetchall()
    edges = []
    for row in found:
        if row[1] is None:
            break  # no edge: the one row says only whether a run is open
        (edge,) = rows.instances(row[1:-1])
        assert isinstance(edge, Dependency)
        edges.append((edge, str(row[-1])))
    return Edges(bool(found[0][0]), edges)


@functools.cache
def _edges(vendor: str) -> tuple[str, Rows]:
    rows = Rows.only(Dependency, ("id", "task", "on", "condition", "artifact", "required"))
    edge, task, run = _table(Dependency), _table(Task), _table(Run)
    open_run = f"EXISTS (SELECT 1 FROM {run} WHERE {_col(Run, 'task')} = %s AND {_col(Run, 'state')} IN (%s, %s))"
    return (f"SELECT {open_run}, {rows.columns()}, {task}.{_col(Task, 'state')} "
            f"FROM (SELECT 1) AS asked LEFT JOIN {edge} ON {edge}.{_col(Dependency, 'task')} = %s "
            f"LEFT JOIN {task} ON {task}.{_col(Task, 'id')} = {edge}.{_col(Dependency, 'on')} "
            f"ORDER BY {edge}.{_col(Dependency, 'id')}"), rows


def dependents_of(task_id: str, *, only_condition: str | None = None) -> list[tuple[str, str]]:
    """(task id, edge condition) of each queued task waiting on ``task_id`` (only edges of
    ``only_condition``, when given): every final move asks."""
    params = [task_id, State.QUEUED.value, *([only_condition] if only_condition else [])]
    with connection.cursor() as cursor:
        cursor.execute(_dependents(connection.vendor, only_condition is not None), params)
        return [(str(dependent), str(condition)) for dependent, condition in cursor.fetchall()]


@functools.cache
def _dependents(vendor: str, one_condition: bool) -> str:
    edge, task = _table(Dependency), _table(Task)
    waiting, condition = f"{edge}.{_col(Dependency, 'task')}", f"{edge}.{_col(Dependency, 'condition')}"
    statement = (f"SELECT DISTINCT {waiting}, {condition} FROM {edge} INNER JOIN {task} ON {task}.{_col(Task, 'id')} = {waiting} "
                 f"WHERE {edge}.{_col(Dependency, 'on')} = %s AND {task}.{_col(Task, 'state')} = %s")
    return statement + (f" AND {condition} = %s" if one_condition else "")


# --- layers and their stacks ----------------------------------------------------------------------

def layer_task_ids(workspace_id: int, state: str, *, newest_first: bool) -> list[str]:
    """The tasks of the workspace's layers in ``state``: every start and release reads the stack."""
    with connection.cursor() as cursor:
        cursor.execute(_layer_task_ids(connection.vendor, newest_first), [workspace_id, state])
        return [task_id for (task_id,) in cursor.fetchall()]


@functools.cache
def _layer_task_ids(vendor: str, newest_first: bool) -> str:
    task, workspace, state, applied, pk = (_col(Layer, name) for name in ("task", "workspace", "state", "applied_at", "id"))
    order = f" ORDER BY {applied} DESC, {pk} DESC" if newest_first else ""
    return f"SELECT {task} FROM {_table(Layer)} WHERE {workspace} = %s AND {state} = %s{order}"


def start_stack(task: Task, applied: str) -> list[str]:
    """The stack a start records (``_start_stack_condition``), newest first: the layers in
    state ``applied`` of the task's workspace it stacks."""
    with connection.cursor() as cursor:
        cursor.execute(_start_stack(connection.vendor), _start_stack_params(task, applied))
        return [task_id for (task_id,) in cursor.fetchall()]


@functools.cache
def _start_stack(vendor: str) -> str:
    table = _table(Layer)
    task_id, applied, pk = (_col(Layer, name) for name in ("task", "applied_at", "id"))
    return (f"SELECT {table}.{task_id} FROM {table} WHERE {_start_stack_condition()} "
            f"ORDER BY {table}.{applied} DESC, {table}.{pk} DESC")


def _start_stack_condition() -> str:
    """Which of the workspace's layers a start stacks, with ``_start_stack_params``: applied, and
    sealed, or applied no later than the task's creation, or a dependency's. Both times are taken
    by the box's processes (``timezone.now``): on several machines their clocks must agree, as
    the runs' leases already need."""
    table, tasks, edges = _table(Layer), _table(Task), _table(Dependency)
    workspace, state, sealed, applied, task_id = (_col(Layer, name) for name in ("workspace", "state", "sealed", "applied_at", "task"))
    created, task_pk = _col(Task, "created_at"), _col(Task, "id")
    edge_task, edge_on = _col(Dependency, "task"), _col(Dependency, "on")
    return (f"{table}.{workspace} = %s AND {table}.{state} = %s AND ({table}.{sealed} = %s "
            f"OR {table}.{applied} <= (SELECT {tasks}.{created} FROM {tasks} WHERE {tasks}.{task_pk} = %s) "
            f"OR EXISTS (SELECT 1 FROM {edges} WHERE {edges}.{edge_task} = %s AND {edges}.{edge_on} = {table}.{task_id}))")


def _start_stack_params(task: Task, applied: str) -> list[Any]:
    return [task.workspace_id, applied, True, task.pk, task.pk]


def add_layer_with_stack(task: Task, layer: Layer, applied: str) -> tuple[int, list[str]] | None:
    """``layer``'s row inserted and the task's stack (``start_stack``'s) recorded in one
    statement (PostgreSQL), which commits alone: the layer's id and the stack. None when the task
    has its row already (a retry): nothing is written."""
    fields = [field for field in Layer._meta.local_concrete_fields if not field.primary_key]
    insert = InsertQuery(Layer)
    insert.insert_values(fields, [layer])
    compiler = insert.get_compiler(connection=connection)
    prepared = [compiler.prepare_value(field, compiler.pre_save_val(field, layer)) for field in fields]
    placeholders, params = compiler.assemble_as_sql(fields, [prepared])
    with connection.cursor() as cursor:
        cursor.execute(_add_layer(connection.vendor, ", ".join(placeholders[0])),
                       [*params[0], *_start_stack_params(task, applied), task.pk])
        found = cursor.fetchall()
    if not found:
        return None
    stack = found[0][1]
    return int(found[0][0]), json.loads(stack) if isinstance(stack, str) else stack  # a driver may hand jsonb back as text


@functools.cache
def _add_layer(vendor: str, values: str) -> str:
    table, tasks = _table(Layer), _table(Task)
    columns = ", ".join(_col(Layer, field.name) for field in Layer._meta.local_concrete_fields if not field.primary_key)
    pk, task_id, applied = (_col(Layer, name) for name in ("id", "task", "applied_at"))
    # The stack as ``start_stack`` reads it, newest first; the new row is active, not in it.
    return (f"WITH added AS (INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({task_id}) DO NOTHING "
            f"RETURNING {pk}), "
            f"stack AS (SELECT COALESCE(jsonb_agg({table}.{task_id} ORDER BY {table}.{applied} DESC, {table}.{pk} DESC), "
            f"'[]'::jsonb) AS ids FROM {table} WHERE {_start_stack_condition()}) "
            f"UPDATE {tasks} SET {_col(Task, 'layers')} = stack.ids FROM added, stack WHERE {tasks}.{_col(Task, 'id')} = %s "
            f"RETURNING added.{pk}, {tasks}.{_col(Task, 'layers')}")


def seal_layer_row(task: Task, layer: Layer, manifest: dict[str, Any], applied: str, since: datetime) -> bool:
    """The seal's write of ``layer``'s row: its manifest, ``sealed``, and ``note_due`` (a layer
    in state ``applied`` of the workspace, applied from ``since`` until ``layer`` was, is not in
    the stack its task recorded), computed by the database, where the stack stays. ``note_due``."""
    at = _field(Layer, "applied_at")
    with connection.cursor() as cursor:
        cursor.execute(_seal(connection.vendor), [
            _field(Layer, "manifest").get_db_prep_save(manifest, connection=connection), True, task.workspace_id, applied,
            at.get_db_prep_value(since, connection=connection), at.get_db_prep_value(layer.applied_at, connection=connection),
            task.pk, task.pk, layer.pk])
        found = cursor.fetchall()
    return bool(found and found[0][0])


@functools.cache
def _seal(vendor: str) -> str:
    table, tasks = _table(Layer), _table(Task)
    manifest, sealed, due, pk, workspace, state, applied, task_id = (_col(Layer, name) for name in (
        "manifest", "sealed", "note_due", "id", "workspace", "state", "applied_at", "task"))
    stack = f"(SELECT {tasks}.{_col(Task, 'layers')} FROM {tasks} WHERE {tasks}.{_col(Task, 'id')} = %s)"
    if vendor == "postgresql":
        unstacked = f"NOT ({stack} ? other.{task_id})"  # jsonb: the array holds that string
    else:
        unstacked = f"other.{task_id} NOT IN (SELECT value FROM json_each({stack}))"
    return (f"UPDATE {table} SET {manifest} = %s, {sealed} = %s, {due} = EXISTS (SELECT 1 FROM {table} AS other "
            f"WHERE other.{workspace} = %s AND other.{state} = %s AND other.{applied} >= %s AND other.{applied} < %s "
            f"AND other.{task_id} <> %s AND {unstacked}) WHERE {table}.{pk} = %s RETURNING {table}.{due}")


# --- the vault -----------------------------------------------------------------------------------

def vault_stamp() -> tuple[Any, ...]:
    """How many secrets, the last change, the highest id: any write to the vault changes one.
    Asked several times per run, only to compare with the last."""
    with connection.cursor() as cursor:
        cursor.execute(_vault_stamp(connection.vendor))
        return tuple(cursor.fetchone())


@functools.cache
def _vault_stamp(vendor: str) -> str:
    return (f"SELECT COUNT(*), MAX({_col(VaultSecret, 'updated_at')}), MAX({_col(VaultSecret, 'id')}) "
            f"FROM {_table(VaultSecret)}")

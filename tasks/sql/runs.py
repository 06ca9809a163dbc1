"""Runs and their leases, and the embedded queue's table."""
from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django_q.models import OrmQ

from boxsite.core.db.rows import Rows, column
from tasks.models import Run, RunState, Task, Workspace
from tasks.sql.base import col, joined_task_and_workspace, quoted, table_of

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
    of_run = f"SELECT {col(Run, 'task')} FROM {table_of(Run)} WHERE {col(Run, 'id')} = %s AND {col(Run, 'state')} = %s"
    if not connection.features.has_select_for_update:
        return of_run  # SQLite: BEGIN IMMEDIATE holds the one write lock already
    task_pk = col(Task, "id")
    return f"SELECT {task_pk} FROM {table_of(Task)} WHERE {task_pk} = ({of_run}) FOR UPDATE"


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
    sets = ", ".join(f"{col(Run, name)} = %s" for name in _TAKEN)
    return f"UPDATE {table_of(Run)} SET {sets} WHERE {col(Run, 'id')} = %s AND {col(Run, 'state')} = %s"


def _others_running(run: str) -> str:
    """Whether a run of ``run``'s task other than it is running."""
    other, task, state, pk = quoted("other_run"), col(Run, "task"), col(Run, "state"), col(Run, "id")
    return (f"EXISTS (SELECT 1 FROM {table_of(Run)} {other} WHERE {other}.{task} = {run}.{task} "
            f"AND {other}.{state} = %s AND {other}.{pk} <> {run}.{pk})")


@functools.cache
def _taken(vendor: str) -> tuple[str, Rows]:
    """The claim's update and ``_claimed``'s read in one statement (PostgreSQL): the run as the
    update left it, its task and workspace, whether another run is running (read as before the
    update, which only moves this run)."""
    rows = Rows.of(Run, Task, Workspace)
    taken = quoted("taken")
    run_columns = [col(Run, field.name) for field in Run._meta.concrete_fields]
    statement = (f"WITH {taken} AS ({_take(vendor)} RETURNING {', '.join(run_columns)}) "
                 f"SELECT {', '.join(f'{taken}.{name}' for name in run_columns)}, {Rows.of(Task, Workspace).columns()}, "
                 f"{_others_running(taken)} FROM {taken} {joined_task_and_workspace(taken, col(Run, 'task'))}")
    return statement, rows


@functools.cache
def _claimed(vendor: str) -> tuple[str, Rows]:
    """The claimed run with its task, the task's workspace (the run's view opens on it), and
    whether another run of the task is running (SQLite)."""
    rows = Rows.of(Run, Task, Workspace)
    run = table_of(Run)
    return (f"SELECT {rows.columns()}, {_others_running(run)} FROM {run} {joined_task_and_workspace(run, col(Run, 'task'))} "
            f"WHERE {run}.{col(Run, 'id')} = %s"), rows


def extend_lease(run_id: int, token: str, now: datetime, expires: datetime) -> bool:
    """Extend the run's lease to ``expires`` if it still holds it: every guarded write of a run
    proves its lease with this. False when the lease is gone."""
    with connection.cursor() as cursor:
        cursor.execute(lease_update(connection.vendor), lease_params(run_id, token, now, expires))
        return cursor.rowcount == 1


@functools.cache
def lease_update(vendor: str) -> str:
    beat, expires, pk, state, token = (col(Run, name) for name in ("heartbeat_at", "lease_expires_at", "id", "state", "lease_token"))
    return f"UPDATE {table_of(Run)} SET {beat} = %s, {expires} = %s WHERE {pk} = %s AND {state} = %s AND {token} = %s"


def lease_params(run_id: int, token: str, now: datetime, expires: datetime) -> list[Any]:
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(now), adapt(expires), run_id, RunState.RUNNING.value, token]


def lease_lasts(run_id: int, token: str, until: datetime) -> bool:
    """The run holds its lease until at least ``until``, as last committed: a plain read, which
    neither extends the lease nor waits for a transaction that holds the run's row."""
    with connection.cursor() as cursor:
        cursor.execute(_lease_lasts(connection.vendor),
                       [run_id, RunState.RUNNING.value, token, connection.ops.adapt_datetimefield_value(until)])
        return cursor.fetchone() is not None


@functools.cache
def _lease_lasts(vendor: str) -> str:
    pk, state, token, expires = (col(Run, name) for name in ("id", "state", "lease_token", "lease_expires_at"))
    return f"SELECT 1 FROM {table_of(Run)} WHERE {pk} = %s AND {state} = %s AND {token} = %s AND {expires} > %s"


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
    state, outcome, error, finished, charged, pk, token = (col(Run, name) for name in (
        "state", "outcome", "error", "finished_at", "charged", "id", "lease_token"))
    return (f"UPDATE {table_of(Run)} SET {state} = %s, {outcome} = %s, {error} = %s, {finished} = %s, "
            f"{charged} = %s WHERE {pk} = %s AND {state} = %s AND {token} = %s")


def cancel_open_runs(task_id: str, finished_at: datetime) -> None:
    """Close every queued or running run of the task: every final move does."""
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(_cancel_open(connection.vendor), [RunState.CANCELLED.value, adapt(finished_at), "cancelled", task_id,
                                                         RunState.QUEUED.value, RunState.RUNNING.value])


@functools.cache
def _cancel_open(vendor: str) -> str:
    state, token, finished, outcome, of_task = (col(Run, name) for name in ("state", "lease_token", "finished_at", "outcome", "task"))
    return (f"UPDATE {table_of(Run)} SET {state} = %s, {token} = '', {finished} = %s, {outcome} = %s "
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
    named = connections[alias].ops.quote_name
    queue = named(OrmQ._meta.db_table)
    pk, key, payload, lock = (named(column(OrmQ, name)) for name in ("id", "key", "payload", "lock"))
    return (f"SELECT {pk}, {payload}, {lock} FROM {queue} WHERE {key} = %s AND {lock} < %s LIMIT %s",
            f"UPDATE {queue} SET {lock} = %s WHERE {pk} = %s AND {lock} = %s",
            f"DELETE FROM {queue} WHERE {pk} = %s")

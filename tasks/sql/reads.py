"""Reads of a task, its dependencies, its layers' stacks, and the vault's stamp."""
from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.sql.subqueries import InsertQuery

from boxsite.core.db.rows import Rows
from tasks.models import Dependency, Layer, Run, RunState, Task, VaultSecret, Workspace
from tasks.sql.base import col, field_of, joined_task_and_workspace, table_of
from tasks.states import ACTIVE, State

# --- reads of a task ----------------------------------------------------------------------------

def owned_task(task_id: str, owner_id: int) -> Task | None:
    """The task if ``owner_id`` owns it: each view of a task asks once."""
    return _one_task(*_owned_task(connection.vendor), [task_id, owner_id])


def _one_task(statement: str, rows: Rows, params: list[str | int]) -> Task | None:
    found = rows.fetch_one(statement, params)
    if found is None:
        return None
    (task,) = found
    assert isinstance(task, Task)
    return task


@functools.cache
def _owned_task(vendor: str) -> tuple[str, Rows]:
    rows = Rows.of(Task)
    return f"SELECT {rows.columns()} FROM {table_of(Task)} WHERE {col(Task, 'id')} = %s AND {col(Task, 'owner')} = %s", rows


def task_state(task_id: str) -> str | None:
    """The task's state now, or None when it is gone: a view's opening and a seal ask."""
    with connection.cursor() as cursor:
        cursor.execute(_task_state(connection.vendor), [task_id])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


@functools.cache
def _task_state(vendor: str) -> str:
    return f"SELECT {col(Task, 'state')} FROM {table_of(Task)} WHERE {col(Task, 'id')} = %s"


def locked_task(task_id: str) -> Task | None:
    """Every column of the task, its row locked for the rest of the transaction (where the
    database has row locks): each run's finish reads its task again."""
    return _one_task(*_locked_task(connection.vendor), [task_id])


@functools.cache
def _locked_task(vendor: str) -> tuple[str, Rows]:
    rows = Rows.of(Task)
    statement = f"SELECT {rows.columns()} FROM {table_of(Task)} WHERE {col(Task, 'id')} = %s"
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
    state, waiting_for = col(Task, "state"), col(Task, "waiting_for")
    return (f"SELECT COUNT(*) FROM {table_of(Task)} WHERE {state} IN ({', '.join(['%s'] * len(ACTIVE))}) "
            f"AND NOT ({state} = %s AND {waiting_for} = %s)")


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
    task = table_of(Task)
    where = f"WHERE {task}.{col(Task, 'id')} = %s AND {task}.{col(Task, 'state')} = %s"
    if not connection.features.has_select_for_update:
        return f"SELECT {rows.columns()} FROM {task} {where}", rows
    assert skip_locked, "a wait for both locks is two statements, in the lock order (services._held_if_queued)"
    owner_model = get_user_model()
    owner = table_of(owner_model)
    return (f"SELECT {rows.columns()} FROM {task} INNER JOIN {owner} ON "
            f"{owner}.{col(owner_model, owner_model._meta.pk.name)} = {task}.{col(Task, 'owner')} "
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
    edge, task, run = table_of(Dependency), table_of(Task), table_of(Run)
    open_run = f"EXISTS (SELECT 1 FROM {run} WHERE {col(Run, 'task')} = %s AND {col(Run, 'state')} IN (%s, %s))"
    return (f"SELECT {open_run}, {rows.columns()}, {task}.{col(Task, 'state')} "
            f"FROM (SELECT 1) AS asked LEFT JOIN {edge} ON {edge}.{col(Dependency, 'task')} = %s "
            f"LEFT JOIN {task} ON {task}.{col(Task, 'id')} = {edge}.{col(Dependency, 'on')} "
            f"ORDER BY {edge}.{col(Dependency, 'id')}"), rows


def dependents_of(task_id: str, *, only_condition: str | None = None) -> list[tuple[str, str]]:
    """(task id, edge condition) of each queued task waiting on ``task_id`` (only edges of
    ``only_condition``, when given): every final move asks."""
    params = [task_id, State.QUEUED.value, *([only_condition] if only_condition else [])]
    with connection.cursor() as cursor:
        cursor.execute(_dependents(connection.vendor, only_condition is not None), params)
        return [(str(dependent), str(condition)) for dependent, condition in cursor.fetchall()]


@functools.cache
def _dependents(vendor: str, one_condition: bool) -> str:
    edge, task = table_of(Dependency), table_of(Task)
    waiting, condition = f"{edge}.{col(Dependency, 'task')}", f"{edge}.{col(Dependency, 'condition')}"
    statement = (f"SELECT DISTINCT {waiting}, {condition} FROM {edge} INNER JOIN {task} ON {task}.{col(Task, 'id')} = {waiting} "
                 f"WHERE {edge}.{col(Dependency, 'on')} = %s AND {task}.{col(Task, 'state')} = %s")
    return statement + (f" AND {condition} = %s" if one_condition else "")


# --- layers and their stacks ----------------------------------------------------------------------

def layer_task_ids(workspace_id: int, state: str, *, newest_first: bool) -> list[str]:
    """The tasks of the workspace's layers in ``state``: every start and release reads the stack."""
    with connection.cursor() as cursor:
        cursor.execute(_layer_task_ids(connection.vendor, newest_first), [workspace_id, state])
        return [task_id for (task_id,) in cursor.fetchall()]


@functools.cache
def _layer_task_ids(vendor: str, newest_first: bool) -> str:
    task, workspace, state, applied, pk = (col(Layer, name) for name in ("task", "workspace", "state", "applied_at", "id"))
    order = f" ORDER BY {applied} DESC, {pk} DESC" if newest_first else ""
    return f"SELECT {task} FROM {table_of(Layer)} WHERE {workspace} = %s AND {state} = %s{order}"


def start_stack(task: Task, applied: str) -> list[str]:
    """The stack a start records (``_start_stack_condition``), newest first: the layers in
    state ``applied`` of the task's workspace it stacks."""
    with connection.cursor() as cursor:
        cursor.execute(_start_stack(connection.vendor), _start_stack_params(task, applied))
        return [task_id for (task_id,) in cursor.fetchall()]


@functools.cache
def _start_stack(vendor: str) -> str:
    table = table_of(Layer)
    task_id, applied, pk = (col(Layer, name) for name in ("task", "applied_at", "id"))
    return (f"SELECT {table}.{task_id} FROM {table} WHERE {_start_stack_condition()} "
            f"ORDER BY {table}.{applied} DESC, {table}.{pk} DESC")


def _start_stack_condition() -> str:
    """Which of the workspace's layers a start stacks, with ``_start_stack_params``: applied, and
    sealed, or applied no later than the task's creation, or a dependency's. Both times are taken
    by the box's processes (``timezone.now``): on several machines their clocks must agree, as
    the runs' leases already need."""
    table, tasks, edges = table_of(Layer), table_of(Task), table_of(Dependency)
    workspace, state, sealed, applied, task_id = (col(Layer, name) for name in ("workspace", "state", "sealed", "applied_at", "task"))
    created, task_pk = col(Task, "created_at"), col(Task, "id")
    edge_task, edge_on = col(Dependency, "task"), col(Dependency, "on")
    return (f"{table}.{workspace} = %s AND {table}.{state} = %s AND ({table}.{sealed} = %s "
            f"OR {table}.{applied} <= (SELECT {tasks}.{created} FROM {tasks} WHERE {tasks}.{task_pk} = %s) "
            f"OR EXISTS (SELECT 1 FROM {edges} WHERE {edges}.{edge_task} = %s AND {edges}.{edge_on} = {table}.{task_id}))")


def _start_stack_params(task: Task, applied: str) -> list[Any]:
    return [task.workspace_id, applied, True, task.pk, task.pk]


def add_layer_with_stack(task: Task, layer: Layer, applied: str) -> tuple[int, list[str]] | None:
    """``layer``'s row inserted and the task's stack (``start_stack``'s) recorded in one
    statement (PostgreSQL), which commits alone: the layer's id and the stack. None when the task
    has its row already (a retry): nothing is written."""
    values, params = _layer_values(layer)
    with connection.cursor() as cursor:
        cursor.execute(_add_layer(connection.vendor, values), [*params, *_start_stack_params(task, applied), task.pk])
        found = cursor.fetchall()
    if not found:
        return None
    stack = found[0][1]
    return int(found[0][0]), json.loads(stack) if isinstance(stack, str) else stack  # a driver may hand jsonb back as text


def add_layer_then_stack(task: Task, layer: Layer, applied: str) -> tuple[int, list[str]] | None:
    """What ``add_layer_with_stack`` does, where a ``WITH`` cannot insert (SQLite): the row
    inserted, the stack read and recorded, three statements; call inside a transaction. None
    when the task has its row already (a retry): nothing is written."""
    values, params = _layer_values(layer)
    with connection.cursor() as cursor:
        cursor.execute(_insert_layer(connection.vendor, values), params)
        found = cursor.fetchall()
        if not found:
            return None
        stack = start_stack(task, applied)
        cursor.execute(_record_stack(connection.vendor),
                       [field_of(Task, "layers").get_db_prep_save(stack, connection=connection), task.pk])
    return int(found[0][0]), stack


def _layer_values(layer: Layer) -> tuple[str, list[Any]]:
    """The placeholders and parameters of ``layer``'s row, as the ORM's insert prepares them."""
    fields = [field for field in Layer._meta.local_concrete_fields if not field.primary_key]
    insert = InsertQuery(Layer)
    insert.insert_values(fields, [layer])
    compiler = insert.get_compiler(connection=connection)
    prepared = [compiler.prepare_value(field, compiler.pre_save_val(field, layer)) for field in fields]
    placeholders, params = compiler.assemble_as_sql(fields, [prepared])
    return ", ".join(placeholders[0]), list(params[0])


@functools.cache
def _insert_layer(vendor: str, values: str) -> str:
    columns = ", ".join(col(Layer, field.name) for field in Layer._meta.local_concrete_fields if not field.primary_key)
    return (f"INSERT INTO {table_of(Layer)} ({columns}) VALUES ({values}) ON CONFLICT ({col(Layer, 'task')}) DO NOTHING "
            f"RETURNING {col(Layer, 'id')}")


@functools.cache
def _record_stack(vendor: str) -> str:
    return f"UPDATE {table_of(Task)} SET {col(Task, 'layers')} = %s WHERE {col(Task, 'id')} = %s"


@functools.cache
def _add_layer(vendor: str, values: str) -> str:
    table, tasks = table_of(Layer), table_of(Task)
    columns = ", ".join(col(Layer, field.name) for field in Layer._meta.local_concrete_fields if not field.primary_key)
    pk, task_id, applied = (col(Layer, name) for name in ("id", "task", "applied_at"))
    # The stack as ``start_stack`` reads it, newest first; the new row is active, not in it.
    return (f"WITH added AS (INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({task_id}) DO NOTHING "
            f"RETURNING {pk}), "
            f"stack AS (SELECT COALESCE(jsonb_agg({table}.{task_id} ORDER BY {table}.{applied} DESC, {table}.{pk} DESC), "
            f"'[]'::jsonb) AS ids FROM {table} WHERE {_start_stack_condition()}) "
            f"UPDATE {tasks} SET {col(Task, 'layers')} = stack.ids FROM added, stack WHERE {tasks}.{col(Task, 'id')} = %s "
            f"RETURNING added.{pk}, {tasks}.{col(Task, 'layers')}")


def seal_layer_row(task: Task, layer: Layer, manifest: dict[str, Any], applied: str, since: datetime) -> bool:
    """The seal's write of ``layer``'s row: its manifest, ``sealed``, and ``note_due`` (a layer
    in state ``applied`` of the workspace, applied from ``since`` until ``layer`` was, is not in
    the stack its task recorded), computed by the database, where the stack stays. ``note_due``."""
    at = field_of(Layer, "applied_at")
    with connection.cursor() as cursor:
        cursor.execute(_seal(connection.vendor), [
            field_of(Layer, "manifest").get_db_prep_save(manifest, connection=connection), True, task.workspace_id, applied,
            at.get_db_prep_value(since, connection=connection), at.get_db_prep_value(layer.applied_at, connection=connection),
            task.pk, task.pk, layer.pk])
        found = cursor.fetchall()
    return bool(found and found[0][0])


@functools.cache
def _seal(vendor: str) -> str:
    table, tasks = table_of(Layer), table_of(Task)
    manifest, sealed, due, pk, workspace, state, applied, task_id = (col(Layer, name) for name in (
        "manifest", "sealed", "note_due", "id", "workspace", "state", "applied_at", "task"))
    stack = f"(SELECT {tasks}.{col(Task, 'layers')} FROM {tasks} WHERE {tasks}.{col(Task, 'id')} = %s)"
    if vendor == "postgresql":
        unstacked = f"NOT ({stack} ? other.{task_id})"  # jsonb: the array holds that string
    else:
        unstacked = f"other.{task_id} NOT IN (SELECT value FROM json_each({stack}))"
    return (f"UPDATE {table} SET {manifest} = %s, {sealed} = %s, {due} = EXISTS (SELECT 1 FROM {table} AS other "
            f"WHERE other.{workspace} = %s AND other.{state} = %s AND other.{applied} >= %s AND other.{applied} < %s "
            f"AND other.{task_id} <> %s AND {unstacked}) WHERE {table}.{pk} = %s RETURNING {table}.{due}")


# --- a layer with its task ------------------------------------------------------------------------

# What a seal and a release read of a layer's task: making the model of the whole row (every
# field, JSON decoded) costs more than the read itself. Any other field is read when first used.
SEALED_BY = ("id", "state", "workspace", "layers", "folders", "created_at")


def layer_with_task(task_id: str) -> tuple[Layer, Task] | None:
    """Task ``task_id``'s layer (every column), its task (``SEALED_BY``) and the task's workspace:
    every seal and every release reads them. None when the task has no layer."""
    statement, rows = _layer_with_task(connection.vendor)
    found = rows.fetch_one(statement, [task_id])
    if found is None:
        return None
    layer, task, workspace = found
    assert isinstance(layer, Layer) and isinstance(task, Task) and isinstance(workspace, Workspace)
    layer.task, task.workspace = task, workspace
    return layer, task


@functools.cache
def _layer_with_task(vendor: str) -> tuple[str, Rows]:
    rows = Rows((Layer, Task, Workspace),
                (Rows.of(Layer).readers[0], Rows.only(Task, SEALED_BY).readers[0], Rows.of(Workspace).readers[0]))
    layer = table_of(Layer)
    return (f"SELECT {rows.columns()} FROM {layer} {joined_task_and_workspace(layer, col(Layer, 'task'))} "
            f"WHERE {layer}.{col(Layer, 'task')} = %s"), rows


# --- the vault -----------------------------------------------------------------------------------

def vault_stamp() -> tuple[Any, ...]:
    """How many secrets, the last change, the highest id: any write to the vault changes one.
    Asked several times per run, only to compare with the last."""
    with connection.cursor() as cursor:
        cursor.execute(_vault_stamp(connection.vendor))
        return tuple(cursor.fetchone())


@functools.cache
def _vault_stamp(vendor: str) -> str:
    return (f"SELECT COUNT(*), MAX({col(VaultSecret, 'updated_at')}), MAX({col(VaultSecret, 'id')}) "
            f"FROM {table_of(VaultSecret)}")

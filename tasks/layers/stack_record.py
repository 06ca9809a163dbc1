"""The stacks of a workspace's layers: the one it shows now (``current_stack``), and the one a
task's start records for good (``record_layer``).

Both are read at every start and release, so their statements are written once per process
(not built by the ORM each time), quoted through the connection, for both databases.
"""
from __future__ import annotations

import functools
import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Field, Model
from django.db.models.sql.subqueries import InsertQuery

from tasks.layers import paths
from tasks.layers.base import driver_name
from tasks.layers.locks import workspace_lock
from tasks.models import Dependency, Layer, LayerState, Task, Workspace
from tasks.states import State


def current_stack(workspace: Workspace | int) -> list[str]:
    """The done tasks whose layers make up the workspace now, newest first. Read at every start
    and release, so the statement is written once, not built by the ORM each time."""
    pk = workspace if isinstance(workspace, int) else workspace.pk
    return layer_task_ids(pk, LayerState.APPLIED, newest_first=True)


def layer_task_ids(workspace_id: int, state: str, *, newest_first: bool) -> list[str]:
    """The tasks of the workspace's layers in ``state``."""
    with connection.cursor() as cursor:
        cursor.execute(_layer_task_ids_statement(connection.vendor, newest_first), [workspace_id, state])
        return [task_id for (task_id,) in cursor.fetchall()]


@functools.cache
def _layer_task_ids_statement(vendor: str, newest_first: bool) -> str:
    quote = connection.ops.quote_name
    task, workspace, state, applied, pk = (quote(_column(Layer, name)) for name in
                                           ("task", "workspace", "state", "applied_at", "id"))
    order = f" ORDER BY {applied} DESC, {pk} DESC" if newest_first else ""
    return f"SELECT {task} FROM {quote(Layer._meta.db_table)} WHERE {workspace} = %s AND {state} = %s{order}"


def _column(model: type[Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column is not None
    return field.column


def record_layer(task: Task) -> Layer:
    """Create the task's layer row and record its stack, once (a retry finds them). Call under
    ``lifecycle.prepare``'s hold on the task: one start of it at a time, so the row is inserted
    plainly, with no ``get_or_create`` (on PostgreSQL, with the stack, in one statement).

    The stack is the workspace's applied layers, newest first, less those the task may do
    without (docs/decisions.md, "A start leaves out a layer that finished after its task was
    asked for"): a layer whose seal is not complete, of a task that finished after this task was
    created and that this task does not depend on. ``seal_stack`` then waits for (or does) the
    seal of every layer kept; a layer left out is neither waited for nor sealed, and
    never joins this task's view (a retry keeps the stack recorded here)."""
    driver, path = driver_name(), str(paths.layer_dir(task.pk))
    if connection.vendor == "postgresql" and not task.folders:
        with workspace_lock(task.workspace_id):
            added = _add_layer_with_stack(task, Layer(task_id=task.pk, workspace_id=task.workspace_id, driver=driver, path=path))
        if added is not None:
            return added
    existing = next(iter(Layer.objects.filter(task_id=task.pk)), None)  # one at most: no ordering
    if existing is not None:
        task.layers = Task.objects.filter(pk=task.pk).values_list("layers", flat=True).get()
        return existing
    if task.folders:
        return Layer.objects.create(task=task, workspace=None, driver=driver, path=path)
    with workspace_lock(task.workspace_id):
        with transaction.atomic():
            layer = Layer.objects.create(task=task, workspace_id=task.workspace_id, driver=driver, path=path)
            task.layers = _start_stack(task)
            Task.objects.filter(pk=task.pk).update(layers=task.layers)
    return layer


def _start_stack(task: Task) -> list[str]:
    """SQLite, inside ``record_layer``'s transaction: the stack a start records."""
    with connection.cursor() as cursor:
        cursor.execute(_start_stack_statement(connection.vendor), _start_stack_params(task))
        return [task_id for (task_id,) in cursor.fetchall()]


@functools.cache
def _start_stack_statement(vendor: str) -> str:
    quote = connection.ops.quote_name
    table = quote(Layer._meta.db_table)
    task_id, applied, pk = (quote(_column(Layer, name)) for name in ("task", "applied_at", "id"))
    return (f"SELECT {table}.{task_id} FROM {table} WHERE {_start_stack_condition()} "
            f"ORDER BY {table}.{applied} DESC, {table}.{pk} DESC")


def _start_stack_condition() -> str:
    """Which of the workspace's layers a start stacks, with ``_start_stack_params``: applied, and
    sealed, or applied no later than the task's creation, or a dependency's. Both times are taken
    by the box's processes (``timezone.now``): on several machines their clocks must agree, as
    the runs' leases already need."""
    quote = connection.ops.quote_name
    table, tasks, edges = (quote(model._meta.db_table) for model in (Layer, Task, Dependency))
    workspace, state, sealed, applied, task_id = (quote(_column(Layer, name)) for name in
                                                  ("workspace", "state", "sealed", "applied_at", "task"))
    created, task_pk = quote(_column(Task, "created_at")), quote(_column(Task, "id"))
    edge_task, edge_on = (quote(_column(Dependency, name)) for name in ("task", "on"))
    return (f"{table}.{workspace} = %s AND {table}.{state} = %s AND ({table}.{sealed} = %s "
            f"OR {table}.{applied} <= (SELECT {tasks}.{created} FROM {tasks} WHERE {tasks}.{task_pk} = %s) "
            f"OR EXISTS (SELECT 1 FROM {edges} WHERE {edges}.{edge_task} = %s AND {edges}.{edge_on} = {table}.{task_id}))")


def _start_stack_params(task: Task) -> list[Any]:
    return [task.workspace_id, LayerState.APPLIED.value, True, task.pk, task.pk]


def _add_layer_with_stack(task: Task, layer: Layer) -> Layer | None:
    """PostgreSQL, under the workspace lock: the layer row inserted and the task's stack recorded
    in one statement, which commits alone (one round trip on a chained task's path, where the
    look-up, ``BEGIN``, three statements and ``COMMIT`` would be six). None when the task has its row
    already (a retry): nothing is written, and the caller reads the row and the stack recorded.
    ``layer`` names its task by key, so an unsaved row is never cached as ``task.layer``."""
    fields = [field for field in Layer._meta.local_concrete_fields if not field.primary_key]
    insert = InsertQuery(Layer)
    insert.insert_values(fields, [layer])
    compiler = insert.get_compiler(connection=connection)
    prepared = [compiler.prepare_value(field, compiler.pre_save_val(field, layer)) for field in fields]
    placeholders, params = compiler.assemble_as_sql(fields, [prepared])
    with connection.cursor() as cursor:
        cursor.execute(_add_layer_statement(connection.vendor, ", ".join(placeholders[0])),
                       [*params[0], *_start_stack_params(task), task.pk])
        found = cursor.fetchall()
    if not found:
        return None
    layer.pk, task.layers = found[0][0], found[0][1]
    layer.task = task  # saved now: each is the other's cached row, as ``Layer.objects.create`` leaves them
    if isinstance(task.layers, str):  # a driver that hands jsonb back as text
        task.layers = json.loads(task.layers)
    return layer


@functools.cache
def _add_layer_statement(vendor: str, values: str) -> str:
    quote = connection.ops.quote_name
    table, tasks = quote(Layer._meta.db_table), quote(Task._meta.db_table)
    columns = ", ".join(quote(_column(Layer, field.name)) for field in Layer._meta.local_concrete_fields if not field.primary_key)
    pk, task_id, applied = (quote(_column(Layer, name)) for name in ("id", "task", "applied_at"))
    layers, task_pk = quote(_column(Task, "layers")), quote(_column(Task, "id"))
    # The stack as ``_start_stack`` reads it, newest first; the new row is active, not in it.
    return (f"WITH added AS (INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({task_id}) DO NOTHING "
            f"RETURNING {pk}), "
            f"stack AS (SELECT COALESCE(jsonb_agg({table}.{task_id} ORDER BY {table}.{applied} DESC, {table}.{pk} DESC), "
            f"'[]'::jsonb) AS ids FROM {table} WHERE {_start_stack_condition()}) "
            f"UPDATE {tasks} SET {layers} = stack.ids FROM added, stack WHERE {tasks}.{task_pk} = %s "
            f"RETURNING added.{pk}, {tasks}.{layers}")


def write_seal(task: Task, layer: Layer, manifest: dict[str, Any]) -> bool:
    """The seal's write of ``layer``'s row, in one statement: its manifest, ``sealed``, and
    ``note_due`` (whether layers of the workspace were applied before its own that its task's
    view did not show: the override note is due, ``task_view.note_overrides``). Returns
    ``note_due``.

    Those layers can only be among those applied since the task was created, less a lease: a
    start leaves out only layers applied after its task's creation, and a final move takes its
    layer's ``applied_at`` before it commits, so a task created and started meanwhile records
    its stack without it; the bound leaves room for that transaction. The database compares them
    with the stack the task recorded (its row's ``layers``), which never leaves it: fetching the
    ids to compare here would make a row for each task the workspace finished within the lease (a
    burst, a chain posted at once), and naming the stack in the query would grow with the
    workspace's history."""
    field = Layer._meta.get_field("manifest")
    if task.folders or task.state != State.DONE or layer.applied_at is None:
        Layer.objects.filter(pk=layer.pk).update(manifest=manifest, note_due=False, sealed=True)
        return False
    since = task.created_at - timedelta(seconds=settings.BOX_LEASE_SECONDS)
    applied = Layer._meta.get_field("applied_at")
    with connection.cursor() as cursor:
        cursor.execute(_seal_statement(connection.vendor), [
            field.get_db_prep_save(manifest, connection=connection), True, task.workspace_id, LayerState.APPLIED.value,
            applied.get_db_prep_value(since, connection=connection), applied.get_db_prep_value(layer.applied_at, connection=connection),
            task.pk, task.pk, layer.pk])
        found = cursor.fetchall()
    return bool(found and found[0][0])


@functools.cache
def _seal_statement(vendor: str) -> str:
    quote = connection.ops.quote_name
    table, tasks = quote(Layer._meta.db_table), quote(Task._meta.db_table)
    manifest, sealed, due, pk, workspace, state, applied, task_id = (quote(_column(Layer, name)) for name in (
        "manifest", "sealed", "note_due", "id", "workspace", "state", "applied_at", "task"))
    stack = f"(SELECT {tasks}.{quote(_column(Task, 'layers'))} FROM {tasks} WHERE {tasks}.{quote(_column(Task, 'id'))} = %s)"
    if vendor == "postgresql":
        unstacked = f"NOT ({stack} ? other.{task_id})"  # jsonb: the array holds that string
    else:
        unstacked = f"other.{task_id} NOT IN (SELECT value FROM json_each({stack}))"
    return (f"UPDATE {table} SET {manifest} = %s, {sealed} = %s, {due} = EXISTS (SELECT 1 FROM {table} AS other "
            f"WHERE other.{workspace} = %s AND other.{state} = %s AND other.{applied} >= %s AND other.{applied} < %s "
            f"AND other.{task_id} <> %s AND {unstacked}) WHERE {table}.{pk} = %s RETURNING {table}.{due}")

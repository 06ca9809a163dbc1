"""The stacks of a workspace's layers: the one it shows now (``current_stack``), and the one a
task's start records for good (``record_layer``).

Both are read at every start and release: their statements are ``tasks.sql``'s.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from tasks import sql
from tasks.layers import paths
from tasks.layers.base import driver_name
from tasks.layers.locks import workspace_lock
from tasks.models import Layer, LayerState, Task, Workspace
from tasks.states import State


def current_stack(workspace: Workspace | int) -> list[str]:
    """The done tasks whose layers make up the workspace now, newest first. Read at every start
    and release."""
    pk = workspace if isinstance(workspace, int) else workspace.pk
    return layer_task_ids(pk, LayerState.APPLIED, newest_first=True)


def layer_task_ids(workspace_id: int, state: str, *, newest_first: bool) -> list[str]:
    """The tasks of the workspace's layers in ``state``."""
    return sql.layer_task_ids(workspace_id, state, newest_first=newest_first)


def record_layer(task: Task) -> Layer:
    """Create the task's layer row and record its stack, once (a retry finds them). Call under
    ``lifecycle.prepare``'s hold on the task: one start of it at a time, so the row is inserted
    plainly, with no ``get_or_create`` (on PostgreSQL, with the stack, in one statement).

    The stack is the workspace's applied layers, newest first, less those the task may do
    without (docs/internals/decisions-performance.md#performance, "A start leaves out a layer that finished after its task was
    asked for"): a layer whose seal is not complete, of a task that finished after this task was
    created and that this task does not depend on. ``seal_stack`` then waits for (or does) the
    seal of every layer kept; a layer left out is neither waited for nor sealed, and
    never joins this task's view (a retry keeps the stack recorded here)."""
    driver, path = driver_name(), str(paths.layer_dir(task.pk))
    if not task.folders:
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
            task.layers = sql.start_stack(task, LayerState.APPLIED.value)
            Task.objects.filter(pk=task.pk).update(layers=task.layers)
    return layer


def _add_layer_with_stack(task: Task, layer: Layer) -> Layer | None:
    """Under the workspace lock: the layer row inserted and the task's stack recorded, in one
    statement that commits alone on PostgreSQL, in one transaction on SQLite. None when the task
    has its row already (a retry): nothing is written, and the caller reads the row and the stack
    recorded. ``layer`` names its task by key, so an unsaved row is never cached as ``task.layer``."""
    if connection.vendor == "postgresql":
        added = sql.add_layer_with_stack(task, layer, LayerState.APPLIED.value)
    else:
        with transaction.atomic():
            added = sql.add_layer_then_stack(task, layer, LayerState.APPLIED.value)
    if added is None:
        return None
    layer.pk, task.layers = added
    layer.task = task  # saved now: each is the other's cached row, as ``Layer.objects.create`` leaves them
    return layer


def write_seal(task: Task, layer: Layer, manifest: dict[str, Any]) -> bool:
    """The seal's write of ``layer``'s row, in one statement: its manifest, ``sealed``, and
    ``note_due`` (whether layers of the workspace were applied before its own that its task's
    view did not show: the override note is due, ``task_view.note_overrides``). Returns
    ``note_due``.

    Those layers can only be among those applied since the task was created, less a lease: a
    start leaves out only layers applied after its task's creation, and a final move takes its
    layer's ``applied_at`` before it commits, so a task created and started meanwhile records
    its stack without it; the bound leaves room for that transaction. The database compares them
    with the stack the task recorded (its row's ``layers``), which never leaves it: no row per
    task finished within the lease comes back, and the statement does not grow with the
    workspace's history."""
    if task.folders or task.state != State.DONE or layer.applied_at is None:
        Layer.objects.filter(pk=layer.pk).update(manifest=manifest, note_due=False, sealed=True)
        return False
    since = task.created_at - timedelta(seconds=settings.BOX_LEASE_SECONDS)
    return sql.seal_layer_row(task, layer, manifest, LayerState.APPLIED.value, since)

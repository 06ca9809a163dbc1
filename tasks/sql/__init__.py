"""Every hand-written statement of the tasks app, one named function each.

They serve the paths every run, move or request takes, where the ORM would build the same
statement again at each call: each is written once per process and database (``functools.cache``
on the vendor), quoted through the connection, for SQLite and PostgreSQL. A function takes plain
values, prepares them as the model's fields do, and returns what the statement found; what the
rows mean, the locks' order and the side effects after commit are its caller's.
"""
from __future__ import annotations

from tasks.sql.base import EVENT_FIELDS
from tasks.sql.moves import Moved, Released, Step, move_task, next_event_number, numbered_update, record_step, release_held
from tasks.sql.reads import (
    SEALED_BY,
    Edges,
    active_task_count,
    add_layer_then_stack,
    add_layer_with_stack,
    dependents_of,
    edges_of,
    held_queued,
    layer_task_ids,
    layer_with_task,
    locked_task,
    owned_task,
    seal_layer_row,
    start_stack,
    task_state,
    vault_stamp,
)
from tasks.sql.runs import (
    Claimed,
    cancel_open_runs,
    claim_run,
    delete_job,
    due_jobs,
    extend_lease,
    finish_run,
    lease_lasts,
    take_job,
    task_of_queued_run,
)

__all__ = ["SEALED_BY", "Claimed", "EVENT_FIELDS", "Edges", "Moved", "Released", "Step", "active_task_count", "add_layer_then_stack", "add_layer_with_stack", "cancel_open_runs", "claim_run", "delete_job", "dependents_of", "due_jobs", "edges_of", "extend_lease", "finish_run", "held_queued", "layer_task_ids", "layer_with_task", "lease_lasts", "locked_task", "move_task", "next_event_number", "numbered_update", "owned_task", "record_step", "release_held", "seal_layer_row", "start_stack", "take_job", "task_state", "task_of_queued_run", "vault_stamp"]

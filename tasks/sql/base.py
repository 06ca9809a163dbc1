"""What the statements of ``tasks.sql`` share: quoting through the connection, a model's
columns and fields, an event's row."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import connection
from django.db.models import Field, Model

from boxsite.core.db.rows import column
from tasks.models import Task, TaskEvent, Workspace

# An event's columns in the statements' order; its number is the update's, not a parameter.
EVENT_FIELDS = ("task", "kind", "summary", "data", "cost_cents", "artifacts", "created_at")


def quoted(name: str) -> str:
    return connection.ops.quote_name(name)


def col(model: type[Model], name: str) -> str:
    return quoted(column(model, name))


def table_of(model: type[Model]) -> str:
    return quoted(model._meta.db_table)


def joined_task_and_workspace(source: str, task_column: str) -> str:
    """The joins from ``source`` (a table or alias whose ``task_column`` names a task) to that
    task and the task's workspace."""
    task, workspace = table_of(Task), table_of(Workspace)
    return (f"INNER JOIN {task} ON {source}.{task_column} = {task}.{col(Task, 'id')} "
            f"INNER JOIN {workspace} ON {task}.{col(Task, 'workspace')} = {workspace}.{col(Workspace, 'id')}")


def field_of(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete
    return field


def prepared(model: type[Model], values: Mapping[str, Any]) -> list[Any]:
    return [field_of(model, name).get_db_prep_save(value, connection=connection) for name, value in values.items()]


def event_row(event: Mapping[str, Any]) -> list[Any]:
    return [field_of(TaskEvent, name).get_db_prep_save(event[name], connection=connection) for name in EVENT_FIELDS]


def event_columns() -> tuple[str, str]:
    """The event table and its columns: the task's, the number's, then the rest of ``EVENT_FIELDS``."""
    names = [EVENT_FIELDS[0], "seq", *EVENT_FIELDS[1:]]
    return table_of(TaskEvent), ", ".join(col(TaskEvent, name) for name in names)

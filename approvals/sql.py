"""Every hand-written statement of the approvals app, one named function each: written once per
process and database, on paths every task's final move takes, where the ORM would build the same
statement again at each call."""
from __future__ import annotations

import functools

from django.db import connection, models

from approvals.models import NOT_STARTED, Action, ActionState, Approval, ApprovalState, Question, QuestionState
from boxsite.core.db.rows import column

# The blockers' tables and the states in which each row still holds a task.
_OPEN_STATES: tuple[tuple[type[models.Model], tuple[str, ...]], ...] = (
    (Approval, (ApprovalState.PENDING,)),
    (Question, (QuestionState.STAGED, QuestionState.OPEN)),
    (Action, (*NOT_STARTED, ActionState.EXECUTING)),
)


def has_open_blockers(task_id: str) -> bool:
    """Whether the task has a pending approval, a staged or open question, or an action not
    finished: most tasks end with none, and one statement says so."""
    statement, states = _has_open(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(statement, [value for group in states for value in (task_id, *group)])
        return bool(cursor.fetchone()[0])


@functools.cache
def _has_open(vendor: str) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """``SELECT EXISTS (...) OR EXISTS (...) OR EXISTS (...)`` over the blocker tables, and the
    states each counts as open (its parameters follow the task's id)."""
    quote = connection.ops.quote_name
    tests = []
    for model, states in _OPEN_STATES:
        table = quote(model._meta.db_table)
        task, state = (quote(column(model, name)) for name in ("task", "state"))
        tests.append(f"EXISTS (SELECT 1 FROM {table} WHERE {task} = %s AND {state} IN ({', '.join(['%s'] * len(states))}))")
    return "SELECT " + " OR ".join(tests), tuple(tuple(str(s) for s in states) for _, states in _OPEN_STATES)

"""What one agent turn costs the database, counted in process: a guard against its writes creeping
back (the turn's time in the box beyond its command is mostly these)."""
from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks.jobs import execute_run
from tasks.layers import sealer
from tasks.models import Run, Task
from tasks.run import lifecycle
from tests.conftest import Box, queue_through_the_cluster
from tests.fakemodel import FakeModel, call

# Statements each further turn with one write_file call adds (BEGIN and COMMIT included): the
# budget read, the turn's step with the model call counted, the cost (a transaction of its own),
# the turn's result, the tool call with its action counted, and its result with the conversation
# saved past it. On PostgreSQL each event is one statement; SQLite wraps each in a transaction.
PER_TURN = {"sqlite": 28, "postgresql": 11}


def _statements(box: Box, settings: Any, model: FakeModel, turns: int) -> int:
    queue_through_the_cluster(settings)
    # The task before this one is released and sealed first: its writes, in their own threads,
    # would otherwise meet this run's on SQLite's one lock, and a write tried again counts twice.
    assert lifecycle.janitor.drain() and sealer.drain()
    model.answer(*[call("write_file", path=f"f{n}.txt", content="x") for n in range(turns)], call("finish", answer="wrote"))
    task = box.create(title="counted turns", prompt="write some files", budgetCents=100)
    run_id = Run.objects.get(task_id=task["id"]).pk
    with CaptureQueriesContext(connection) as queries:
        execute_run(run_id)
    assert Task.objects.get(pk=task["id"]).state == "done"
    return len(queries.captured_queries)


def test_each_further_agent_turn_executes_no_more_statements_than_counted(box: Box, settings: Any, model: FakeModel) -> None:
    one = _statements(box, settings, model, 1)
    four = _statements(box, settings, model, 4)
    per_turn = (four - one) / 3
    assert per_turn <= PER_TURN[connection.vendor], per_turn

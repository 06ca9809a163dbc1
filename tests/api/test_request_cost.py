"""What the requests a client makes for every task cost the database, in statements: creating a
trivial task, then following it (its view, its events, the list of what is still going). A
figure that grows is a statement added to every task's path; lower it here when a
change takes one away."""
from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks.models import Task
from tests.conftest import Box, queue_through_the_cluster
from tests.factories import flow

TRIVIAL = flow({"write": {"path": "out.txt", "content": "x"}})

# The most statements each request may take, on either database.
MOST = {"create": 11, "create dependent": 15, "view": 7, "events": 4, "list": 3}


@pytest.fixture
def followed(box: Box, settings: Any) -> tuple[Box, str]:
    queue_through_the_cluster(settings)
    box.create(title="first", flow=TRIVIAL)  # the settings row exists from here on
    return box, box.create(title="followed", flow=TRIVIAL)["id"]


def _statements(call: Any) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = call()
    assert response.status_code in (200, 201), response.json()
    return [q["sql"] for q in queries.captured_queries]


def test_creating_a_trivial_task_takes_at_most_its_statements(followed: tuple[Box, str]) -> None:
    box, _ = followed
    statements = _statements(lambda: box.api.post("/api/tasks", {"title": "t", "flow": TRIVIAL}, format="json"))
    assert len(statements) <= MOST["create"], statements


def test_creating_a_task_counts_the_active_tasks_once(followed: tuple[Box, str]) -> None:
    box, _ = followed
    statements = _statements(lambda: box.api.post("/api/tasks", {"title": "t", "flow": TRIVIAL}, format="json"))
    counts = [s for s in statements if "COUNT(*)" in s.upper() and '"tasks_task"' in s]
    assert len(counts) == 1, statements


def test_creating_a_dependent_reads_its_dependency_once(followed: tuple[Box, str]) -> None:
    box, task_id = followed
    statements = _statements(lambda: box.api.post("/api/tasks", {"title": "t", "flow": TRIVIAL, "dependsOn": [task_id]},
                                                  format="json"))
    rows = [s for s in statements if s.upper().startswith("SELECT") and 'FROM "tasks_task"' in s and task_id in s]
    assert len(rows) == 1, statements


def test_creating_a_dependent_takes_at_most_its_statements(followed: tuple[Box, str]) -> None:
    """The edge of a task being created is not checked against the database (it has no edge
    yet, nothing waits for it), and the note of what it waits for is the verdict's."""
    box, task_id = followed
    statements = _statements(lambda: box.api.post("/api/tasks", {"title": "t", "flow": TRIVIAL, "dependsOn": [task_id]},
                                                  format="json"))
    assert len(statements) <= MOST["create dependent"], statements


def test_a_dependents_creation_costs_the_same_at_the_end_of_a_long_chain(followed: tuple[Box, str]) -> None:
    """The cycle check does not walk the chain: the new task is one nothing waits for."""
    box, first = followed
    last = first
    for i in range(6):
        last = box.create(title=f"link {i}", flow=TRIVIAL, dependsOn=[last])["id"]
    costs = [len(_statements(lambda on=on: box.api.post("/api/tasks", {"title": "t", "flow": TRIVIAL, "dependsOn": [on]},
                                                         format="json"))) for on in (first, last)]
    assert costs[0] == costs[1], costs


def test_a_tasks_view_takes_at_most_its_statements(followed: tuple[Box, str]) -> None:
    box, task_id = followed
    statements = _statements(lambda: box.api.get(f"/api/tasks/{task_id}"))
    assert len(statements) <= MOST["view"], statements


def test_a_tasks_events_take_at_most_their_statements(followed: tuple[Box, str]) -> None:
    box, task_id = followed
    statements = _statements(lambda: box.api.get(f"/api/tasks/{task_id}/events?after=0"))
    assert len(statements) <= MOST["events"], statements


def test_the_list_of_what_is_still_going_takes_at_most_its_statements(followed: tuple[Box, str]) -> None:
    box, _ = followed
    statements = _statements(lambda: box.api.get("/api/tasks?state=queued,running,waiting&limit=1"))
    assert len(statements) <= MOST["list"], statements


def test_a_creation_numbers_its_first_event_without_updating_its_task(followed: tuple[Box, str]) -> None:
    box, _ = followed
    statements = _statements(lambda: box.api.post("/api/tasks", {"title": "t", "flow": TRIVIAL}, format="json"))
    assert not [s for s in statements if s.upper().startswith('UPDATE "TASKS_TASK"')], statements


def _log(box: Box, task_id: str) -> list[dict[str, Any]]:
    response = box.api.get(f"/api/tasks/{task_id}/events?after=0")
    assert response.status_code == 200, response.json()
    return list(response.json()["events"])


def test_a_created_tasks_log_is_numbered_from_one_without_a_gap(box: Box) -> None:
    """The creation's event takes number 1 with the task's insert; the run's events go on from there."""
    task_id = box.create(title="runs here", flow=TRIVIAL)["id"]  # in the test: django-q2's sync mode
    assert box.task(task_id)["state"] == "done"
    events = _log(box, task_id)
    seqs = [event["seq"] for event in events]
    assert len(seqs) > 2 and seqs == list(range(1, len(seqs) + 1)), events
    assert (events[0]["kind"], events[0]["data"]["to"]) == ("status", "queued")
    assert Task.objects.get(pk=task_id).event_seq == seqs[-1]


def test_a_dependents_note_at_its_creation_follows_its_first_event(followed: tuple[Box, str]) -> None:
    box, queued = followed  # nobody takes its run: the dependent waits
    task_id = box.create(title="waits", flow=TRIVIAL, dependsOn=[queued])["id"]
    events = _log(box, task_id)
    assert [(event["seq"], event["kind"]) for event in events] == [(1, "status"), (2, "note")], events
    assert Task.objects.get(pk=task_id).event_seq == 2

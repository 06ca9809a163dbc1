"""Limits bound a whole task across its runs; only time spent running counts, never time spent
waiting for a person. Running out fails the task as recoverable, with a hint."""
from __future__ import annotations

from datetime import datetime

from tests.factories import flow
from tests.pauses.helpers import cont, report


def _ms_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() * 1000


def test_max_actions_counts_across_runs_split_by_a_pause(box):
    spec = flow({"run": "echo a >> log.txt"}, {"run": "echo b >> log.txt", "stop_before": "b is for real"},
                {"run": "echo c >> log.txt"})
    task = box.create(title="limited", flow=spec, limits={"max_actions": 2})
    box.wait_state(task["id"], "waiting")
    assert box.task(task["id"])["spent"]["actions"] == 1
    assert cont(box, task["id"], approve=True).status_code == 200
    view = box.wait_state(task["id"], "failed")
    assert view["spent"]["actions"] == 2
    assert "max_actions" in view["error"] and view["recoverable"] is True
    assert "limits.max_actions" in view["hint"]
    assert [s["outcome"] for s in report(box, task["id"])["steps"]] == ["done", "done"]


def test_running_out_of_time_stops_the_step_and_fails_recoverably(box):
    task = box.create(title="slow", flow=flow({"run": "sleep 30"}), limits={"max_elapsed_ms": 1000})
    view = box.wait_state(task["id"], "failed", timeout=20)
    assert "max_elapsed_ms" in view["error"] and view["recoverable"] is True
    assert "limits.max_elapsed_ms" in view["hint"]
    assert _ms_between(view["startedAt"], view["finishedAt"]) < 10_000  # killed, not waited out


def test_each_run_gets_only_the_time_the_task_has_left(box):
    # Wide margins: a loaded machine adds seconds of its own to each run, and that time counts.
    limit = 8000
    spec = flow({"run": "sleep 2"}, {"run": "sleep 60", "stop_before": "go on"})
    task = box.create(title="slow", flow=spec, limits={"max_elapsed_ms": limit})
    first = box.wait_state(task["id"], "waiting", "failed")
    assert first["state"] == "waiting", first["error"]
    spent_first = first["spent"]["elapsed_ms"]
    assert 2000 <= spent_first < limit
    response = cont(box, task["id"], approve=True)
    assert response.status_code == 200, response.content
    view = box.wait_state(task["id"], "failed", timeout=40)
    assert "max_elapsed_ms" in view["error"]
    # The second run was cut when the task's time ran out, not after a whole limit of its own
    # (which would make it at least the first run's time plus the limit).
    assert limit <= view["spent"]["elapsed_ms"] < spent_first + limit


def test_time_spent_waiting_for_a_person_does_not_count(box):
    spec = flow({"run": "sleep 0.3"}, {"run": "sleep 0.3", "stop_before": "go on"})
    task = box.create(title="patient", flow=spec, limits={"max_elapsed_ms": 3000})
    box.wait_state(task["id"], "waiting")
    # While it waits, the owner is busy with something else that takes longer than the limit.
    other = box.create(title="meanwhile", flow=flow({"run": "sleep 3.5"}))
    box.wait_state(other["id"], "done", timeout=30)
    assert cont(box, task["id"], approve=True).status_code == 200
    view = box.wait_state(task["id"], "done")
    assert view["spent"]["elapsed_ms"] < 3000
    assert _ms_between(view["startedAt"], view["finishedAt"]) > 3000

"""``POST /api/tasks/<id>/retry``: a recoverable failure goes on in place, from the step that
failed, after the owner raised what it ran out of; anything else is refused in the error shape."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from tasks.models import Run, Task
from tests.conftest import Box, queue_through_the_cluster
from tests.factories import flow

# Three acting steps under max_actions=2: the third runs out of actions before it starts.
TRAIL = flow(
    {"run": "echo one >> trail.txt"},
    {"run": "echo two >> trail.txt"},
    {"run": "echo three >> trail.txt; cat trail.txt", "save": "trail"},
)


def _failed_at_the_limit(box: Box, **spec: Any) -> dict[str, Any]:
    task = box.create(title="three steps, two actions", flow=TRAIL, limits={"max_actions": 2}, **spec)
    view = box.wait_state(task["id"], "failed")
    assert view["recoverable"] is True, view
    return view


def _retry(box: Box, task_id: str, body: Any = None) -> Any:
    return box.api.post(f"/api/tasks/{task_id}/retry", body if body is not None else {}, format="json")


def test_a_failure_that_ran_out_of_a_limit_offers_retry_and_its_hint_says_so(box: Box) -> None:
    view = _failed_at_the_limit(box)
    assert "retry" in view["next"]
    assert "limits.max_actions" in view["hint"] and "retry" in view["hint"]


def test_retry_raises_the_limit_and_goes_on_from_the_failed_step(box: Box) -> None:
    view = _failed_at_the_limit(box)
    response = _retry(box, view["id"], {"limits": {"max_actions": 3}})
    assert response.status_code == 200, response.json()
    assert response.json()["limits"]["max_actions"] == 3
    done = box.wait_state(view["id"], "done")
    # Steps 1 and 2 had finished: they did not run again.
    assert Task.objects.get(pk=view["id"]).records["trail"] == "one\ntwo\nthree"
    assert done["limits"]["max_actions"] == 3
    assert done["error"] is None and done["recoverable"] is None and "retry" not in done["next"]
    runs = box.api.get(f"/api/tasks/{view['id']}/runs").json()["results"]
    assert [(r["number"], r["mode"], r["outcome"]) for r in runs] == [(2, "retry", "done"), (1, "start", "failed")]
    statuses = [e["summary"] for e in box.events(view["id"]) if e["kind"] == "status"]
    assert any("retried by the owner" in s and "limits.max_actions to 3" in s for s in statuses), statuses


def test_retry_raises_the_budget(box: Box) -> None:
    view = _failed_at_the_limit(box, budgetCents=10)
    response = _retry(box, view["id"], {"limits": {"max_actions": 5}, "budgetCents": 500})
    assert response.status_code == 200, response.json()
    assert box.wait_state(view["id"], "done")["budgetCents"] == 500


@pytest.mark.parametrize(("body", "field"), [
    ({"limits": {"max_actions": 1}}, "limits.max_actions"),
    ({"budgetCents": 5}, "budgetCents"),
    ({"limits": {"max_elapsed_ms": 1000}}, "limits.max_elapsed_ms"),  # unbounded now: bounding it lowers it
    ({"limits": {"max_rescues": 9}}, "limits.max_rescues"),
    ({"limits": {"max_actions": "5"}}, "limits.max_actions"),
    ({"limits": {"timeout_s": 600}}, "limits.timeout_s"),
    ({"limits": []}, "limits"),
    ({"budget": 500}, "budget"),
    ({"approve": True}, "approve"),
])
def test_retry_refuses_lowering_and_unknown_or_malformed_fields_naming_them(box: Box, body: dict[str, Any], field: str) -> None:
    view = _failed_at_the_limit(box, budgetCents=10)
    response = _retry(box, view["id"], body)
    assert response.status_code == 400, response.json()
    assert response.json()["field"] == field, response.json()
    assert response.json()["code"] == "INVALID_REQUEST"
    after = box.task(view["id"])
    assert (after["state"], after["version"], after["limits"]["max_actions"]) == ("failed", view["version"], 2)
    assert Run.objects.filter(task_id=view["id"]).count() == 1


def test_a_body_that_is_not_an_object_is_refused(box: Box) -> None:
    view = _failed_at_the_limit(box)
    response = box.api.post(f"/api/tasks/{view['id']}/retry", [1, 2], format="json")
    assert response.status_code == 400 and response.json()["code"] == "INVALID_REQUEST", response.json()


def test_a_structural_failure_cannot_be_retried(box: Box) -> None:
    task = box.create(title="no such program", prompt="run it", worker="command", command=["./not-there.sh"])
    view = box.wait_state(task["id"], "failed")
    assert view["recoverable"] is False and "retry" not in view["next"], view
    response = _retry(box, task["id"])
    assert response.status_code == 409, response.json()
    assert response.json()["code"] == "CONFLICT"
    assert "not recoverable" in response.json()["message"]
    assert box.task(task["id"])["state"] == "failed"


def test_only_a_failed_task_can_be_retried(box: Box) -> None:
    done = box.create(title="fine", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    box.wait_state(done["id"], "done")
    waiting = box.create(title="asks", flow=flow({"approve": "go on?"}))
    box.wait_state(waiting["id"], "waiting")
    for task_id, state in ((done["id"], "done"), (waiting["id"], "waiting")):
        response = _retry(box, task_id)
        assert response.status_code == 409, response.json()
        assert response.json()["code"] == "CONFLICT"
        assert f"a {state} task cannot be retried" in response.json()["message"]
        assert "retry" not in box.task(task_id)["next"]


def test_a_retry_that_names_an_old_version_is_refused(box: Box) -> None:
    view = _failed_at_the_limit(box)
    response = _retry(box, view["id"], {"version": view["version"] - 1, "limits": {"max_actions": 3}})
    assert response.status_code == 409 and response.json()["field"] == "version", response.json()
    assert box.task(view["id"])["state"] == "failed"


def test_a_retried_task_is_retried_once_when_two_ask_at_once(box: Box, settings: Any) -> None:
    view = _failed_at_the_limit(box)
    queue_through_the_cluster(settings)  # the retry's run stays queued: nothing else moves the task
    barrier = threading.Barrier(2)
    answers: list[int] = []

    def ask() -> None:
        try:
            barrier.wait(timeout=10)
            answers.append(_retry(box, view["id"], {"limits": {"max_actions": 3}}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == [200, 409], answers
    assert Run.objects.filter(task_id=view["id"], kind="retry").count() == 1
    after = box.task(view["id"])
    assert after["state"] == "queued" and after["version"] == view["version"] + 1, after

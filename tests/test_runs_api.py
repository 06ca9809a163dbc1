"""Runs are public history: GET /api/tasks/<id>/runs pages a task's attempts with a cursor bound
to its sort, in a projection that never shows prompts, leases, workers or paths."""
from __future__ import annotations

import json

from tasks.models import Run
from tests.conftest import Box
from tests.factories import flow

GATED = flow({"approve": "go on?"}, {"write": {"path": "g.txt", "content": "g"}})
HIDDEN = {"lease_token", "leaseToken", "leaseExpiresAt", "heartbeatAt", "workerHost", "workerPid", "resume", "prompt",
          "path", "workdir"}


def runs(box: Box, task_id: str, **params: str) -> dict:
    response = box.api.get(f"/api/tasks/{task_id}/runs", params)
    assert response.status_code == 200, response.json()
    return response.json()


def test_attempts_page_with_a_cursor_bound_to_the_sort(box: Box) -> None:
    task = box.create(title="gated", flow=GATED)["id"]
    box.wait_state(task, "waiting")
    assert box.api.post(f"/api/tasks/{task}/continue", {"approve": True}, format="json").status_code == 200
    box.wait_state(task, "done")

    first = runs(box, task, limit="1")
    assert [r["number"] for r in first["results"]] == [2] and first["next"]
    second = runs(box, task, limit="1", cursor=first["next"])
    assert [r["number"] for r in second["results"]] == [1] and second["next"] is None
    assert [r["mode"] for r in runs(box, task, sort="number")["results"]] == ["start", "resume"]
    assert [r["number"] for r in runs(box, task, sort="-started")["results"]] == [2, 1]

    stale = box.api.get(f"/api/tasks/{task}/runs", {"sort": "number", "cursor": first["next"]})
    assert stale.status_code == 400 and stale.json()["field"] == "cursor"
    forged = box.api.get(f"/api/tasks/{task}/runs", {"cursor": first["next"][:-3] + "abc"})
    assert forged.status_code == 400 and forged.json()["field"] == "cursor"
    assert box.api.get(f"/api/tasks/{task}/runs", {"sort": "worker_pid"}).status_code == 400


def test_a_wait_for_the_owner_is_refunded_and_total_attempts_count_every_run(box: Box) -> None:
    task = box.create(title="gated", flow=GATED)["id"]
    box.wait_state(task, "waiting")
    box.api.post(f"/api/tasks/{task}/continue", {"approve": True}, format="json")
    box.wait_state(task, "done")
    body = runs(box, task, sort="number")
    assert [(r["outcome"], r["charged"]) for r in body["results"]] == [("waiting:approval", False), ("done", True)]
    assert body["attempts"] == {"total": 2, "charged": 1}
    assert all(r["usage"]["elapsedMs"] >= 0 for r in body["results"])


def test_the_projection_hides_workers_leases_and_secrets(box: Box) -> None:
    task = box.create(title="fails loudly", facts={"password": "hunter2-secret-value"},
                      flow=flow({"run": "echo ${password} >&2; exit 3"}))["id"]
    box.wait_state(task, "failed")
    row = Run.objects.get(task_id=task)
    assert row.worker_pid and row.worker_host  # the box knows; the owner's API does not say
    body = runs(box, task)
    text = json.dumps(body)
    assert "hunter2-secret-value" not in text and "${password}" in text
    for result in body["results"]:
        assert not HIDDEN & set(result), set(result)
        assert set(result) == {"number", "mode", "attempt", "state", "outcome", "error", "charged", "usage",
                               "createdAt", "startedAt", "finishedAt"}


def test_another_owners_runs_are_not_found(box: Box) -> None:
    task = box.create(title="mine", flow=GATED)["id"]
    box.api.credentials()
    assert box.api.get(f"/api/tasks/{task}/runs").status_code in (401, 403)

"""A task creates work from inside its sandbox, on a real django-q2 cluster: the child runs in
the cluster like any task, and cancelling the creator cancels it; with the policy off the call
is refused and nothing is created."""
from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from tasks.models import Run, Task
from tests.broker.conftest import events_of
from tests.conftest import Box, wait_for
from tests.factories import flow

pytestmark = pytest.mark.usefixtures("cluster")

GATED_CHILD = {"title": "child", "flow": flow({"approve": "go on?"}, {"write": {"path": "c.txt", "content": "c"}})}


def creator(box: Box, then: str) -> dict[str, Any]:
    script = f"box task --spec {shlex.quote(json.dumps(GATED_CHILD))} && {then}"
    return box.create(title="creator", worker="command", prompt="p", command=["/bin/sh", "-c", script])


def test_cancelling_the_creator_cancels_the_child_it_made_from_its_sandbox(box: Box) -> None:
    assert box.api.patch("/api/settings", {"tasksMayCreateWork": True}, format="json").status_code == 200
    parent = creator(box, "box approve 'hold here'")
    held = box.wait_state(parent["id"], "waiting", "done", "failed")
    assert held["state"] == "waiting", held["error"]
    child_id = wait_for(lambda: Task.objects.filter(parent_id=parent["id"]).values_list("pk", flat=True).first(),
                        what="the child task")
    child = box.wait_state(child_id, "waiting", "done", "failed")  # ran in the cluster up to its gate
    assert child["state"] == "waiting" and child["createdBy"] == {"task": parent["id"], "run": 1}

    response = box.api.post(f"/api/tasks/{parent['id']}/cancel")
    assert response.status_code == 200, response.json()
    assert box.task(child_id)["state"] == "cancelled"
    assert [e["summary"] for e in events_of(box, child_id, "status")][-1] == f"cancelled with task {parent['id']}"
    assert not Run.objects.filter(task_id__in=[parent["id"], child_id], state__in=["queued", "running"]).exists()
    box.wait_state(parent["id"], "cancelled")


def test_with_the_policy_off_the_sandboxed_call_is_refused_and_nothing_is_made(box: Box) -> None:
    parent = creator(box, "echo never")
    view = box.wait_state(parent["id"], "done", "failed", "cancelled")
    assert view["state"] == "failed"
    assert view["error"].startswith("worker exited with 1: box: the owner's settings do not let a task create tasks")
    assert "NOT_ALLOWED" in view["error"]
    refused = [e["summary"] for e in events_of(box, parent["id"], "error") if e["summary"].startswith("refused")]
    assert len(refused) == 1
    assert "never" not in [e["summary"] for e in events_of(box, parent["id"], "output")]
    assert Task.objects.count() == 1

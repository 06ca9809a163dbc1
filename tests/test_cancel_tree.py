"""Cancellation across descendants: cancelling a task cancels, in one transaction, every active
task below it through ``parent``; what already ended stays as it was."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from approvals.models import Approval
from tasks import services
from tasks.models import Run, Task
from tests.cluster import running_box
from tests.conftest import Box, queue_through_the_cluster, wait_for
from tests.factories import flow

GATED = flow({"approve": "go on?"}, {"write": {"path": "g.txt", "content": "g"}})


def held(box: Box, title: str, **spec: Any) -> str:
    task = box.create(title=title, flow=GATED, **spec)
    box.wait_state(task["id"], "waiting")
    return str(task["id"])


def test_cancelling_a_parent_cancels_its_active_descendants_and_keeps_the_ended(box: Box) -> None:
    parent = held(box, "parent")
    child = held(box, "child", parent=parent)
    grandchild = held(box, "grandchild", parent=child)
    finished = held(box, "finished child", parent=parent)
    assert box.api.post(f"/api/tasks/{finished}/continue", {"approve": True}, format="json").status_code == 200
    box.wait_state(finished, "done")
    other = held(box, "not in the family")

    response = box.api.post(f"/api/tasks/{parent}/cancel")
    assert response.status_code == 200, response.json()
    states = dict(Task.objects.values_list("pk", "state"))
    assert [states[t] for t in (parent, child, grandchild, finished, other)] == [
        "cancelled", "cancelled", "cancelled", "done", "waiting"]
    for task_id in (child, grandchild):
        assert not Run.objects.filter(task_id=task_id, state__in=["queued", "running"]).exists()
        assert set(Approval.objects.filter(task_id=task_id).values_list("state", flat=True)) == {"denied"}
        summary = [e["summary"] for e in box.events(task_id) if e["kind"] == "status"][-1]
        assert summary == f"cancelled with task {parent}"
    assert box.task(parent)["parent"] is None and box.task(child)["parent"] == parent


def test_the_cascade_is_one_transaction(box: Box, monkeypatch: Any) -> None:
    parent = held(box, "parent")
    child = held(box, "child", parent=parent)
    grandchild = held(box, "grandchild", parent=child)
    real = services.transition

    def fails_at_the_grandchild(task: Task, new_state: str, **kw: Any) -> Task:
        if task.pk == grandchild:
            raise RuntimeError("the database went away")
        return real(task, new_state, **kw)

    monkeypatch.setattr(services, "transition", fails_at_the_grandchild)
    box.api.raise_request_exception = False
    assert box.api.post(f"/api/tasks/{parent}/cancel").status_code == 500
    assert set(Task.objects.filter(pk__in=[parent, child, grandchild]).values_list("state", flat=True)) == {"waiting"}


def test_a_parent_must_be_yours_and_not_ended(box: Box) -> None:
    parent = held(box, "parent")
    box.api.post(f"/api/tasks/{parent}/cancel")
    response = box.api.post("/api/tasks", {"title": "late", "flow": GATED, "parent": parent}, format="json")
    assert response.status_code == 409 and response.json()["field"] == "parent"
    response = box.api.post("/api/tasks", {"title": "x", "flow": GATED, "parent": "tk0nothere"}, format="json")
    assert response.status_code == 400 and response.json()["message"] == "no task 'tk0nothere'"
    assert Task.objects.count() == 1


def _processes_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.usefixtures("transactional_db")
def test_a_running_descendant_is_stopped_on_a_real_cluster(box: Box, tmp_path: Path, settings: Any) -> None:
    queue_through_the_cluster(settings)
    marker = "sleep 47.25"
    with running_box(tmp_path, scheduler=False, BOX_WORKERS="2"):
        parent = box.create(title="parent", flow=GATED)
        box.wait_state(parent["id"], "waiting", timeout=60)
        child = box.create(title="busy child", parent=parent["id"], flow=flow({"run": marker}))
        wait_for(lambda: _processes_running(marker), timeout=60, what="the child's step to run")
        assert box.api.post(f"/api/tasks/{parent['id']}/cancel").status_code == 200
        assert box.task(child["id"])["state"] == "cancelled"
        wait_for(lambda: not _processes_running(marker), timeout=20, what="the child's process to be killed")
        run = Run.objects.get(task_id=child["id"])
        assert run.state == "cancelled"
    assert os.getpid() not in _processes_running(marker)

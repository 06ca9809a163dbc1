"""Tasks that create work: `box task` and `box schedule` from inside a task, and the tools
`task.create` and `schedule.create`, only within the owner's policy and the creator's bounds."""
from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from schedules.models import Schedule
from tasks.models import Task
from tests.broker.conftest import events_of
from tests.conftest import Box
from tests.factories import flow


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def allow(box: Box, **more: Any) -> None:
    response = box.api.patch("/api/settings", {"tasksMayCreateWork": True, **more}, format="json")
    assert response.status_code == 200, response.json()


def box_task(spec: dict[str, Any]) -> str:
    return f"box task --spec {shlex.quote(json.dumps(spec))}"


def refusals(box: Box, task_id: str) -> list[str]:
    return [e["summary"] for e in events_of(box, task_id, "error") if e["summary"].startswith("refused to create")]


CHILD = {"title": "child", "prompt": "do it", "worker": "command", "command": "true"}


def test_the_policy_is_off_by_default_and_a_call_is_refused_in_the_log(box: Box) -> None:
    assert box.api.get("/api/settings").json()["tasksMayCreateWork"] is False
    parent = box.create(title="parent", worker="command", prompt="p",
                        command=sh(f'{box_task(CHILD)}; echo "exit=$?"'))
    view = box.wait_state(parent["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert "exit=1" in [e["summary"] for e in events_of(box, parent["id"], "output")], box.events(parent["id"])
    assert refusals(box, parent["id"]) == [
        "refused to create a task: the owner's settings do not let a task create tasks "
        "(Settings → Tasks that create work; it is off by default)"]
    assert Task.objects.count() == 1


def test_the_settings_take_the_policy_and_refuse_bad_values(box: Box) -> None:
    for body, field in (({"tasksMayCreateWork": "yes"}, "tasksMayCreateWork"), ({"maxCreatedPerTask": 0}, "maxCreatedPerTask"),
                        ({"maxCreatedPerTask": 101}, "maxCreatedPerTask"), ({"maxCreatedPerTask": "3"}, "maxCreatedPerTask")):
        response = box.api.patch("/api/settings", body, format="json")
        assert response.status_code == 400 and response.json()["field"] == field, response.json()
    allow(box, maxCreatedPerTask=7)
    shown = box.api.get("/api/settings").json()
    assert (shown["tasksMayCreateWork"], shown["maxCreatedPerTask"]) == (True, 7)


def test_a_task_creates_a_child_with_its_provenance_and_within_its_hosts(box: Box) -> None:
    allow(box)
    parent = box.create(title="parent", worker="command", prompt="p", hosts=["*.example.com"], budgetCents=50,
                        command=sh(box_task({**CHILD, "hosts": ["api.example.com"], "budgetCents": 20})))
    view = box.wait_state(parent["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    child = Task.objects.get(parent_id=parent["id"])
    shown = box.task(child.pk)
    assert shown["parent"] == parent["id"] and shown["createdBy"] == {"task": parent["id"], "run": 1}
    assert shown["source"] == f"task:{parent['id']}" and shown["hosts"] == ["api.example.com"]
    assert shown["budgetCents"] == 20
    assert box.wait_state(child.pk, "done", "failed")["state"] == "done"
    created = [e for e in events_of(box, parent["id"], "note") if e["summary"].startswith("created task")]
    assert created[0]["data"] == {"created": {"task": child.pk}, "run": 1}
    # the process got the child's id on stdout
    assert json.loads([e["summary"] for e in events_of(box, parent["id"], "output")][-1])["task"] == child.pk


def test_a_child_named_without_hosts_gets_the_creators_not_the_owners_default(box: Box) -> None:
    allow(box)
    box.api.patch("/api/settings", {"networkDefault": "allowlist", "defaultHosts": ["pypi.org"]}, format="json")
    parent = box.create(title="parent", worker="command", prompt="p", hosts=[], command=sh(box_task(CHILD)))
    assert box.wait_state(parent["id"], "done", "failed")["state"] == "done"
    assert box.task(Task.objects.get(parent_id=parent["id"]).pk)["hosts"] == []


@pytest.mark.parametrize("wider, field, reason", [
    ({"hosts": ["evil.test.org"]}, "spec.hosts", "host 'evil.test.org' is wider than this task's hosts (*.example.com)"),
    ({"hosts": ["*.com"]}, "spec.hosts", "host '*.com' is wider"),
    ({"budgetCents": 31}, "spec.budgetCents", "a budget of 31¢ is more than this task has left (30¢)"),
    ({"tools": ["notify.owner"]}, "spec.tools", "tool 'notify.owner' is not one this task may call"),
    ({"constraints": {"allow_destructive": True}}, "spec.constraints.allow_destructive", "may not take destructive steps"),
    ({"folders": ["/tmp"]}, "spec.folders", "'/tmp' is not within this task's folders"),
    ({"parent": "t-someone-else"}, "spec.parent", "'parent' is set by the box"),
])
def test_a_child_wider_than_its_creator_is_refused(box: Box, wider: dict[str, Any], field: str, reason: str) -> None:
    allow(box)
    parent = box.create(title="parent", worker="command", prompt="p", hosts=["*.example.com"], budgetCents=30,
                        command=sh(f'{box_task({**CHILD, **wider})} 2>&1; echo "exit=$?"'))
    assert box.wait_state(parent["id"], "done", "failed")["state"] == "done"
    outputs = [e["summary"] for e in events_of(box, parent["id"], "output")]
    assert "exit=1" in outputs
    assert any(reason in line for line in outputs), outputs
    refused = [e for e in events_of(box, parent["id"], "error") if e["summary"].startswith("refused to create a task")]
    assert len(refused) == 1 and refused[0]["data"]["refused"]["field"] == field and reason in refused[0]["summary"]
    assert Task.objects.count() == 1


def test_a_task_creates_at_most_the_owners_bound(box: Box) -> None:
    allow(box, maxCreatedPerTask=2)
    parent = box.create(title="parent", worker="command", prompt="p",
                        command=sh(f'{box_task(CHILD)} && {box_task(CHILD)} && {box_task(CHILD)}'))
    view = box.wait_state(parent["id"], "done", "failed")
    assert view["state"] == "failed"
    assert "already created 2 tasks and schedules, the most one task may" in view["error"] and "NOT_ALLOWED" in view["error"]
    assert Task.objects.filter(created_by_task_id=parent["id"]).count() == 2


def test_a_task_creates_a_schedule_recorded_with_its_provenance(box: Box) -> None:
    allow(box)
    template = json.dumps({"title": "nightly", "prompt": "p", "worker": "command", "command": "true"})
    parent = box.create(title="parent", worker="command", prompt="p", hosts=["example.com"],
                        command=sh(f"box schedule nightly --every 3600 --spec {shlex.quote(template)}"))
    assert box.wait_state(parent["id"], "done", "failed")["state"] == "done"
    listed = box.api.get("/api/schedules").json()["results"]
    assert [(s["name"], s["origin"], s["createdByTask"], s["createdByRun"]) for s in listed] == [
        ("nightly", "task", parent["id"], 1)]
    assert Schedule.objects.get().template["hosts"] == ["example.com"]  # its tasks get no more than the creator


def test_a_schedule_is_refused_when_the_policy_is_off(box: Box) -> None:
    template = json.dumps({"title": "nightly", "prompt": "p", "worker": "command", "command": "true"})
    parent = box.create(title="parent", worker="command", prompt="p",
                        command=sh(f"box schedule nightly --every 3600 --spec {shlex.quote(template)}"))
    view = box.wait_state(parent["id"], "done", "failed")
    assert view["state"] == "failed" and "do not let a task create schedules" in view["error"]
    assert not Schedule.objects.exists()


def test_a_flow_creates_a_child_through_the_task_create_tool_under_the_same_policy(box: Box) -> None:
    steps = flow({"tool": "task.create", "args": {"spec": CHILD}})
    refused = box.create(title="off", flow=steps, tools=["task.create"])
    view = box.wait_state(refused["id"], "done", "failed")
    assert view["state"] == "failed" and "do not let a task create tasks" in view["error"]
    allow(box)
    made = box.create(title="on", flow=steps, tools=["task.create"])
    assert box.wait_state(made["id"], "done", "failed")["state"] == "done"
    child = Task.objects.get(parent_id=made["id"])
    assert (child.created_by_task_id, child.created_by_run) == (made["id"], 1)


def test_a_child_may_work_within_its_creators_folder_and_wait_only_on_what_it_may_reach(box: Box, tmp_path: Any) -> None:
    allow(box)
    folder = tmp_path / "project"
    (folder / "docs").mkdir(parents=True)
    stranger = box.create(title="not the creator's", worker="command", prompt="p", command="true")
    inside = {**CHILD, "folders": [str(folder / "docs")]}
    waits_elsewhere = {**CHILD, "dependsOn": [stranger["id"]]}
    parent = box.create(title="parent", worker="command", prompt="p", folders=[str(folder)],
                        command=sh(f'{box_task(inside)} && {box_task(waits_elsewhere)}; echo "exit=$?"'))
    assert box.wait_state(parent["id"], "done", "failed")["state"] == "done"
    children = list(Task.objects.filter(created_by_task_id=parent["id"]))
    assert [c.folders for c in children] == [[str((folder / "docs").resolve())]]
    refused = [e["data"]["refused"] for e in events_of(box, parent["id"], "error")]
    assert refused == [{"code": "INVALID_SPEC", "field": "dependsOn", "message": f"no task '{stranger['id']}'"}]

"""The task report: the view, the flow, one entry per step reached, saved records, runs,
approvals, questions and rescues; all redacted."""
from __future__ import annotations

from rest_framework.test import APIClient

from tests.factories import flow, make_owner
from tests.pauses.helpers import cont, report


def test_a_done_flow_reports_each_step_once_with_its_records(box):
    spec = flow({"write": {"path": "a.txt", "content": "${greeting}"}, "name": "write it"},
                {"run": "cat a.txt", "save": "text"},
                {"run": "echo '[1, 2]'", "save": "numbers"},
                greeting="hello")
    task = box.create(title="report", flow=spec)
    box.wait_state(task["id"], "done")
    body = report(box, task["id"])
    assert body["view"]["id"] == task["id"] and body["view"]["state"] == "done"
    assert body["flow"] == spec
    assert [(s["step"], s["kind"], s["outcome"], s["attempts"]) for s in body["steps"]] == [
        (1, "write", "done", 1), (2, "run", "done", 1), (3, "run", "done", 1)]
    assert body["steps"][0]["name"] == "write it" and body["steps"][1]["saved"] == "text"
    assert body["records"] == {"text": "hello", "numbers": "[1, 2]"}
    assert body["rescues"] == [] and body["approvals"] == [] and len(body["runs"]) == 1


def test_a_paused_and_resumed_task_reports_every_step_reached_once(box):
    spec = flow({"run": "echo one", "save": "one"}, {"approve": "ok?"}, {"run": "exit 3"}, {"run": "echo never"})
    task = box.create(title="report", flow=spec)
    box.wait_state(task["id"], "waiting")
    waiting = report(box, task["id"])
    assert [(s["step"], s["outcome"]) for s in waiting["steps"]] == [(1, "done"), (2, "waiting for approval")]
    cont(box, task["id"], approve=True)
    box.wait_state(task["id"], "failed")
    body = report(box, task["id"])
    assert [(s["step"], s["outcome"]) for s in body["steps"]] == [(1, "done"), (2, "done"), (3, "failed")]
    assert [a["state"] for a in body["approvals"]] == ["approved"]
    assert [r["kind"] for r in body["runs"]] == ["start", "resume"]
    assert body["runs"][1]["error"].startswith("step 3 (run) failed: exit 3")


def test_the_report_is_redacted(box):
    spec = flow({"run": "echo ${api token} 4111-1111-1111-1111", "save": "said"})
    task = box.create(title="secret", flow=spec, facts={"api token": "tok-very-secret-1"})
    box.wait_state(task["id"], "done")
    response = box.api.get(f"/api/tasks/{task['id']}/report")
    assert b"tok-very-secret-1" not in response.content and b"4111" not in response.content
    assert response.json()["records"]["said"] == "${api token} ${card}"


def test_a_command_task_reports_the_steps_it_logged(box):
    task = box.create(title="cmd", prompt="p", worker="command", command=["sh", "-c", "echo hi"])
    box.wait_state(task["id"], "done")
    steps = report(box, task["id"])["steps"]
    assert steps and steps[0]["step"] == 1 and "summary" in steps[0]


def test_another_owners_report_is_not_found(box):
    task = box.create(title="mine", flow=flow({"run": "true"}))
    other = APIClient()
    other.force_login(make_owner())
    assert other.get(f"/api/tasks/{task['id']}/report").status_code == 404

"""The human inbox: questions staged during a run open only when the run ends waiting; each
answer removes exactly its blocker and bumps the version; a fresh run starts only when no
blocker remains. GET /api/inbox lists open approvals and questions across tasks."""
from __future__ import annotations

from typing import Any

from tests.factories import flow
from tests.pauses.conftest import SEEN_DURING_RUN
from tests.pauses.helpers import open_questions, pending_approval, post, report


def _two_blockers(box, tool: str) -> dict[str, Any]:
    spec = flow({"tool": tool, "args": {"prompt": "which branch?"}},
                {"run": "echo shipped >> log.txt", "stop_before": "ship it"},
                {"run": "cat log.txt", "save": "log"})
    task = box.create(title="two blockers", flow=spec, tools=[tool])
    return box.wait_state(task["id"], "waiting")


def test_a_staged_question_opens_only_when_the_run_ends_waiting(box, staging_tool):
    view = _two_blockers(box, staging_tool)
    assert SEEN_DURING_RUN == [{"approvals": [], "questions": []}]
    inbox = box.api.get("/api/inbox").json()
    assert [a["summary"] for a in inbox["approvals"]] == ["ship it"]
    assert [q["prompt"] for q in inbox["questions"]] == ["which branch?"]
    assert inbox["questions"][0]["taskView"]["id"] == view["id"]
    assert inbox["questions"][0]["taskVersion"] == view["version"]


def test_answering_one_blocker_keeps_the_task_waiting_until_the_last(box, staging_tool):
    view = _two_blockers(box, staging_tool)
    question = open_questions(box, view["id"])[0]
    response = post(box, f"/api/questions/{question['id']}/answer", {"answer": "main"})
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "answered" and response.json()["answeredVia"] == "api"
    after = box.task(view["id"])
    assert after["state"] == "waiting" and after["version"] == view["version"] + 1
    assert len(report(box, view["id"])["runs"]) == 1  # nothing queued while a blocker remains
    approval = pending_approval(box, view["id"])
    assert approval["taskVersion"] == after["version"]  # still valid: same pause
    assert post(box, f"/api/questions/{question['id']}/answer", {"answer": "again"}).status_code == 409
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    box.wait_state(view["id"], "done")
    assert report(box, view["id"])["records"]["log"] == "shipped"


def test_approving_first_waits_for_the_question(box, staging_tool):
    view = _two_blockers(box, staging_tool)
    approval = pending_approval(box, view["id"])
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    assert box.task(view["id"])["state"] == "waiting"
    assert len(report(box, view["id"])["runs"]) == 1
    question = open_questions(box, view["id"])[0]
    assert post(box, f"/api/questions/{question['id']}/answer", {"answer": "main"}).status_code == 200
    box.wait_state(view["id"], "done")


def test_the_inbox_lists_blockers_across_tasks_and_empties_as_they_are_answered(box):
    a = box.create(title="a", flow=flow({"run": "true", "stop_before": "ok a?"}))
    b = box.create(title="b", flow=flow({"run": "echo ${city}"}))
    box.wait_state(a["id"], "waiting")
    box.wait_state(b["id"], "waiting")
    inbox = box.api.get("/api/inbox").json()
    assert [(x["taskView"]["title"], x["summary"]) for x in inbox["approvals"]] == [("a", "ok a?")]
    assert [(x["taskView"]["title"], x["kind"]) for x in inbox["questions"]] == [("b", "input")]
    question = inbox["questions"][0]
    response = post(box, f"/api/questions/{question['id']}/answer", {"inputs": {"city": "Pune"}})
    assert response.status_code == 200, response.json()
    post(box, f"/api/approvals/{inbox['approvals'][0]['id']}/approve")
    box.wait_state(a["id"], "done")
    box.wait_state(b["id"], "done")
    assert box.api.get("/api/inbox").json() == {"approvals": [], "questions": []}


def test_an_input_question_needs_inputs(box):
    task = box.create(title="b", flow=flow({"run": "echo ${city}"}))
    box.wait_state(task["id"], "waiting")
    question = open_questions(box, task["id"])[0]
    response = post(box, f"/api/questions/{question['id']}/answer", {"answer": "Pune"})
    assert response.status_code == 400 and response.json()["field"] == "inputs"
    assert box.api.get("/api/questions/999999").status_code == 404

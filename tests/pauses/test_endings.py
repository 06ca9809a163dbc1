"""Endings and capacity: a task that ends denies its pending approvals and cancels its open
questions; more than max_active_tasks unfinished tasks is 429 TOO_MANY_TASKS."""
from __future__ import annotations

from approvals.blockers import _has_open
from approvals.models import (
    NOT_STARTED,
    Action,
    ActionState,
    Approval,
    ApprovalKind,
    ApprovalState,
    Question,
    QuestionKind,
    QuestionState,
)
from boxsite.models import BoxSettings
from tasks.models import Task
from tests.factories import flow
from tests.pauses.helpers import post

BLOCKED = flow({"tool": "test.ask", "args": {"prompt": "which branch?"}}, {"run": "true", "stop_before": "ship it"})


def test_cancelling_a_waiting_task_closes_every_blocker(box, staging_tool):
    task = box.create(title="blocked", flow=BLOCKED, tools=[staging_tool])
    box.wait_state(task["id"], "waiting")
    response = post(box, f"/api/tasks/{task['id']}/cancel")
    assert response.status_code == 200
    view = box.task(task["id"])
    assert view["state"] == "cancelled"
    assert [(a["state"], a["decidedVia"]) for a in view["approvals"]] == [("denied", "task-ended")]
    assert [q["state"] for q in view["questions"]] == ["cancelled"]
    assert box.api.get("/api/inbox").json() == {"approvals": [], "questions": []}
    question = view["questions"][0]
    assert post(box, f"/api/questions/{question['id']}/answer", {"answer": "late"}).status_code == 409


def test_undoing_a_waiting_task_closes_its_blockers_too(box):
    task = box.create(title="blocked", flow=flow({"run": "echo ${city}"}))
    box.wait_state(task["id"], "waiting")
    assert post(box, f"/api/tasks/{task['id']}/undo").status_code == 200
    assert [q["state"] for q in box.task(task["id"])["questions"]] == ["cancelled"]


def test_more_unfinished_tasks_than_allowed_is_429_and_nothing_is_dropped(box):
    BoxSettings.objects.update_or_create(pk=1, defaults={"max_active_tasks": 2})
    waiting = [box.create(title=f"w{i}", flow=flow({"run": "true", "stop_before": "ok?"})) for i in range(2)]
    for task in waiting:
        box.wait_state(task["id"], "waiting")
    response = box.api.post("/api/tasks", {"title": "one too many", "flow": flow({"run": "true"})}, format="json")
    assert response.status_code == 429
    assert response.json()["code"] == "TOO_MANY_TASKS"
    assert Task.objects.count() == 2
    assert all(box.task(t["id"])["state"] == "waiting" for t in waiting)  # none was evicted
    post(box, f"/api/tasks/{waiting[0]['id']}/cancel")
    box.create(title="now there is room", flow=flow({"run": "true"}))


def test_an_ending_finds_each_kind_of_open_blocker_and_no_closed_one(box):
    """``close_for_final_move`` asks first whether anything is open (one statement of its own)."""
    task = Task.objects.get(pk=box.create(title="quiet", flow=flow({"run": "true"}))["id"])
    box.wait_state(task.pk, "done")
    kinds = [(Approval, {"kind": ApprovalKind.ACTION, "summary": "s", "task_version": 1}, ApprovalState),
             (Question, {"kind": QuestionKind.INPUT}, QuestionState),
             (Action, {"tool": "t"}, ActionState)]
    for model, fields, states in kinds:
        for state in states:
            row = model.objects.create(task=task, state=state, **({"idempotency_key": state} if model is Action else {}), **fields)
            assert _has_open(task) == model.objects.filter(pk=row.pk, **_OPEN[model]).exists(), (model, state)
            row.delete()
    assert not _has_open(task)


_OPEN = {Approval: {"state": ApprovalState.PENDING},
         Question: {"state__in": [QuestionState.STAGED, QuestionState.OPEN]},
         Action: {"state__in": [*NOT_STARTED, ActionState.EXECUTING]}}

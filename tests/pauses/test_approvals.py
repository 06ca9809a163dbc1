"""Approvals: stop_before and approve steps pause; approve runs exactly the guarded step once,
then the rest as a new run; deny cancels; stale and double decisions are safe."""
from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import close_old_connections, transaction
from rest_framework.test import APIClient

from approvals.blockers import request_approval
from approvals.models import Approval, ApprovalKind
from tasks.models import Task
from tasks.tools.registry import Tool, register
from tests.factories import flow, make_owner
from tests.pauses.helpers import cont, pending_approval, post, report

GUARDED = flow(
    {"run": "echo before >> log.txt"},
    {"run": "echo guarded >> log.txt", "stop_before": "append to the log for real", "name": "the guarded step"},
    {"run": "echo after >> log.txt"},
    {"run": "cat log.txt", "save": "log"},
)


def _paused(box, spec=GUARDED, **extra):
    task = box.create(title="guarded", flow=spec, **extra)
    return box.wait_state(task["id"], "waiting")


def test_stop_before_pauses_for_approval_naming_exactly_the_guarded_step(box):
    view = _paused(box)
    assert view["waitingFor"] == "approval"
    assert view["next"][:3] == ["continue", "approve", "deny"]
    approval = pending_approval(box, view["id"])
    assert approval["kind"] == "irreversible"
    assert approval["summary"] == "append to the log for real"
    assert approval["guard"] == {"step": 1, "kind": "run", "name": "the guarded step"}
    assert approval["taskVersion"] == view["version"]
    assert approval["next"] == ["approve", "deny"]
    kinds = [e["kind"] for e in box.events(view["id"])]
    assert "approval" in kinds
    steps = report(box, view["id"])["steps"]
    assert [s["outcome"] for s in steps] == ["done", "waiting for approval"]


def test_approving_runs_the_guarded_step_once_then_the_rest_as_a_new_run(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    response = post(box, f"/api/approvals/{approval['id']}/approve")
    assert response.status_code == 200, response.json()
    decided = response.json()
    assert decided["state"] == "approved"
    assert decided["decidedVia"] == "api" and decided["decidedBy"] == box.owner.get_username()
    assert decided["decidedAt"]
    done = box.wait_state(view["id"], "done")
    body = report(box, view["id"])
    assert body["records"]["log"] == "before\nguarded\nafter"
    runs = [(r["kind"], r["outcome"]) for r in body["runs"]]
    assert runs == [("start", "waiting:approval"), ("resume", "continued"), ("resume", "done")]
    assert done["next"] == ["undo", "diff", "report", "rerun"]


def test_approving_through_continue_works_the_same(box):
    view = _paused(box)
    response = cont(box, view["id"], approve=True)
    assert response.status_code == 200, response.json()
    box.wait_state(view["id"], "done")
    assert report(box, view["id"])["records"]["log"] == "before\nguarded\nafter"


def test_denying_cancels_the_task_and_the_guarded_step_never_runs(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    response = post(box, f"/api/approvals/{approval['id']}/deny")
    assert response.status_code == 200
    assert response.json()["state"] == "denied"
    cancelled = box.task(view["id"])
    assert cancelled["state"] == "cancelled"
    assert cancelled["approvals"][0]["state"] == "denied"
    assert "log" not in report(box, view["id"])["records"]


def test_denying_through_continue_cancels(box):
    view = _paused(box)
    assert cont(box, view["id"], approve=False).status_code == 200
    assert box.task(view["id"])["state"] == "cancelled"


def test_approving_twice_resumes_once(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    first = post(box, f"/api/approvals/{approval['id']}/approve")
    second = post(box, f"/api/approvals/{approval['id']}/approve")
    assert first.status_code == 200 and second.status_code == 200
    box.wait_state(view["id"], "done")
    body = report(box, view["id"])
    assert body["records"]["log"] == "before\nguarded\nafter"
    assert len(body["runs"]) == 3


def test_deciding_after_the_task_moved_on_is_a_stale_approval(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    assert post(box, f"/api/tasks/{view['id']}/cancel").status_code == 200
    response = post(box, f"/api/approvals/{approval['id']}/approve")
    assert response.status_code == 409
    assert response.json()["code"] == "STALE_APPROVAL"
    assert box.task(view["id"])["state"] == "cancelled"


def test_deciding_with_a_version_the_task_has_left_is_a_stale_approval(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    response = post(box, f"/api/approvals/{approval['id']}/approve", {"version": view["version"] - 1})
    assert response.status_code == 409 and response.json()["code"] == "STALE_APPROVAL"
    again = cont(box, view["id"], approve=True, version=view["version"] - 1)
    assert again.status_code == 409 and again.json()["code"] == "STALE_APPROVAL"
    assert pending_approval(box, view["id"])["state"] == "pending"  # nothing was decided
    assert post(box, f"/api/approvals/{approval['id']}/approve", {"version": view["version"]}).status_code == 200
    box.wait_state(view["id"], "done")


def test_an_approval_left_behind_by_a_moved_task_turns_stale(box):
    view = _paused(box)
    task = Task.objects.get(pk=view["id"])
    with transaction.atomic():  # an approval asked at an older version (a run that is long gone)
        old = request_approval(task, ApprovalKind.IRREVERSIBLE, "an old question", guard={"step": 0})

    Approval.objects.filter(pk=old.pk).update(task_version=task.version - 1)
    response = post(box, f"/api/approvals/{old.pk}/approve")
    assert response.status_code == 409 and response.json()["code"] == "STALE_APPROVAL"
    assert box.api.get(f"/api/approvals/{old.pk}").json()["state"] == "stale"


def test_a_contrary_decision_after_one_was_made_is_a_conflict(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    box.wait_state(view["id"], "done")
    response = post(box, f"/api/approvals/{approval['id']}/deny")
    assert response.status_code == 409
    assert box.task(view["id"])["state"] == "done"


def test_allow_destructive_runs_guarded_steps_without_pausing(box):
    task = box.create(title="trusted", flow=GUARDED, constraints={"allow_destructive": True})
    box.wait_state(task["id"], "done")
    body = report(box, task["id"])
    assert body["records"]["log"] == "before\nguarded\nafter"
    assert body["approvals"] == []


def test_an_approve_step_pauses_and_goes_on_when_approved(box):
    spec = flow({"write": {"path": "a.txt", "content": "a"}}, {"approve": "look at a.txt first"},
                {"run": "cat a.txt", "save": "a"})
    view = _paused(box, spec)
    approval = pending_approval(box, view["id"])
    assert approval["summary"] == "look at a.txt first" and approval["guard"]["step"] == 1
    assert cont(box, view["id"], approve=True).status_code == 200
    box.wait_state(view["id"], "done")
    assert report(box, view["id"])["records"]["a"] == "a"


def test_an_irreversible_tool_call_pauses_for_approval(box):
    calls: list[dict] = []
    register(Tool(name="test.launch", description="acts for real", schema={"type": "object"},
                  impl=lambda ctx, args: calls.append(args) or {"launched": True}, irreversible=True))
    spec = flow({"tool": "test.launch", "args": {"target": "${where}"}, "save": "result"}, where="moon")
    view = _paused(box, spec, tools=["test.launch"])
    approval = pending_approval(box, view["id"])
    assert approval["kind"] == "irreversible" and approval["guard"]["step"] == 0
    assert approval["guard"]["tool"] == "test.launch"
    assert calls == []
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    box.wait_state(view["id"], "done")
    assert calls == [{"target": "moon"}]


def test_continue_on_an_approval_needs_a_decision(box):
    view = _paused(box)
    response = cont(box, view["id"], inputs={"x": "1"})
    assert response.status_code == 400 and response.json()["field"] == "approve"
    response = cont(box, view["id"], bogus=True)
    assert response.status_code == 400 and response.json()["field"] == "bogus"


def test_only_the_owner_sees_and_decides_an_approval(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    other = APIClient()
    other.force_login(make_owner())
    assert other.post(f"/api/approvals/{approval['id']}/approve").status_code == 404
    assert other.get(f"/api/approvals/{approval['id']}").status_code == 404
    assert other.get("/api/inbox").json() == {"approvals": [], "questions": []}
    assert pending_approval(box, view["id"])["state"] == "pending"


def test_a_decision_from_the_portal_is_recorded_as_such(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    portal = APIClient()
    portal.force_login(box.owner)
    response = portal.post(f"/api/approvals/{approval['id']}/approve", {}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["decidedVia"] == "portal"


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="concurrent deciders need PostgreSQL row locks")
def test_two_concurrent_approvals_resume_once(box):
    view = _paused(box)
    approval = pending_approval(box, view["id"])
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def approve() -> None:
        close_old_connections()
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {box.token}")
        barrier.wait()
        codes.append(client.post(f"/api/approvals/{approval['id']}/approve", {}, format="json").status_code)
        close_old_connections()

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200, 200]
    box.wait_state(view["id"], "done")
    body = report(box, view["id"])
    assert body["records"]["log"] == "before\nguarded\nafter"
    assert len(body["runs"]) == 3


def test_a_paid_tool_step_over_the_budget_waits_and_approving_raises_the_budget(box):
    calls: list[dict] = []
    register(Tool(name="test.paid", description="costs a quarter", schema={"type": "object"},
                  impl=lambda ctx, args: calls.append(args) or {"ok": True}, cost_cents=25))
    spec = flow({"tool": "test.paid", "args": {"pin": "${pin}"}})
    view = _paused(box, spec, tools=["test.paid"], budgetCents=10, facts={"pin": "918273"})
    approval = pending_approval(box, view["id"])
    assert approval["kind"] == "spending" and approval["amountCents"] == 15
    assert "918273" not in str(approval)  # the guarded call's arguments are stored redacted
    assert calls == [] and box.task(view["id"])["costCents"] == 0
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    done = box.wait_state(view["id"], "done")
    assert calls == [{"pin": "918273"}]
    assert done["budgetCents"] == 25 and done["costCents"] == 25

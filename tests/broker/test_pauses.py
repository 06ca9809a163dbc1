"""Pauses asked for from inside a live process: the process waits, the owner decides.

These run on a real django-q2 cluster (a subprocess), so the API answers while a task's
process blocks in its broker call.
"""
from __future__ import annotations

from typing import Any

import pytest

from tasks.broker.paths import socket_path
from tasks.models import Run
from tasks.sandbox.isolation import describe_isolation
from tests.broker.conftest import Marks, events_of
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("cluster")


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def waiting(box: Any, task_id: str, kind: str) -> dict[str, Any]:
    view = box.wait_state(task_id, "waiting", "done", "failed", "cancelled")
    assert view["state"] == "waiting" and view["waitingFor"] == kind, (view["state"], view["error"])
    return view


def pending_approval(box: Any, task_id: str) -> dict[str, Any]:
    approvals = [a for a in box.task(task_id)["approvals"] if a["state"] == "pending"]
    assert len(approvals) == 1, approvals
    return approvals[0]


def decide(box: Any, approval_id: int, verb: str) -> None:
    response = box.api.post(f"/api/approvals/{approval_id}/{verb}", {}, format="json")
    assert response.status_code == 200, response.json()


def test_a_paid_call_over_the_budget_waits_before_it_is_made_and_approving_raises_the_budget(box: Any, marks: Marks) -> None:
    task = box.create(title="buy", worker="command", prompt="p", tools=["owner.paid"], budgetCents=10,
                      command=sh("box tool owner.paid --args '{\"item\": \"book\"}' && box step bought"))
    view = waiting(box, task["id"], "approval")
    assert marks.made(task["id"]) == []  # the paid call has not been made
    assert view["costCents"] == 0
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "spending" and approval["amountCents"] == 15
    assert "owner.paid" in approval["summary"]

    decide(box, approval["id"], "approve")
    view = box.wait_state(task["id"], "done", "failed", "cancelled")
    assert view["state"] == "done", view["error"]
    assert marks.made(task["id"]) == [{"item": "book"}]  # made exactly once, after the OK
    assert view["costCents"] == 25 and view["budgetCents"] == 25
    kinds = [e["kind"] for e in box.events(task["id"])]
    assert kinds.index("approval") < kinds.index("cost") < kinds.index("tool_result")
    assert any(e["summary"] == "bought" for e in events_of(box, task["id"], "step"))


def test_denying_a_paid_call_over_the_budget_cancels_the_task_and_the_call_never_happens(box: Any, marks: Marks) -> None:
    task = box.create(title="buy", worker="command", prompt="p", tools=["owner.paid"], budgetCents=0,
                      command=sh("box tool owner.paid; box step after-the-call"))
    waiting(box, task["id"], "approval")
    decide(box, pending_approval(box, task["id"])["id"], "deny")
    view = box.wait_state(task["id"], "cancelled", "done", "failed")
    assert view["state"] == "cancelled"

    def run_closed() -> bool:
        return not Run.objects.filter(task_id=task["id"], state__in=["queued", "running"]).exists()

    wait_for(run_closed, what="the held run to close")
    assert marks.made(task["id"]) == []
    assert view["costCents"] == 0 and view["budgetCents"] == 0
    assert not events_of(box, task["id"], "cost")
    assert not any(e["summary"] == "after-the-call" for e in events_of(box, task["id"], "step"))


def test_an_irreversible_tool_waits_for_the_owner(box: Any, marks: Marks) -> None:
    task = box.create(title="launch", worker="command", prompt="p", tools=["owner.launch"],
                      command=sh("box tool owner.launch --args '{\"target\": \"moon\"}'"))
    waiting(box, task["id"], "approval")
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "irreversible" and approval["guard"]["tool"] == "owner.launch"
    assert marks.made(task["id"]) == []
    decide(box, approval["id"], "approve")
    assert box.wait_state(task["id"], "done", "failed", "cancelled")["state"] == "done"
    assert marks.made(task["id"]) == [{"target": "moon"}]


def test_box_approve_and_box_spend_wait_for_the_owner_then_go_on(box: Any) -> None:
    task = box.create(title="gates", worker="command", prompt="p", budgetCents=5,
                      command=sh("box approve 'deploy to production' && box spend 20 --reason 'GPU hour' && box step finished"))
    waiting(box, task["id"], "approval")
    gate = pending_approval(box, task["id"])
    assert gate["summary"] == "deploy to production" and gate["kind"] == "irreversible"
    decide(box, gate["id"], "approve")

    def spend_asked() -> dict[str, Any] | None:
        pending = [a for a in box.task(task["id"])["approvals"] if a["state"] == "pending"]
        return pending[0] if pending else None

    spend = wait_for(spend_asked, what="the spending approval")
    assert spend["kind"] == "spending" and spend["amountCents"] == 15
    decide(box, spend["id"], "approve")
    view = box.wait_state(task["id"], "done", "failed", "cancelled")
    assert view["state"] == "done", view["error"]
    assert view["costCents"] == 20 and view["budgetCents"] == 20
    assert any(e["summary"] == "finished" for e in events_of(box, task["id"], "step"))


def test_box_ask_waits_for_a_value_and_hands_it_to_the_process(box: Any) -> None:
    task = box.create(title="ask", worker="command", prompt="p",
                      command=sh("city=$(box ask city --why 'the report is about it') && box step \"city is $city\""))
    view = waiting(box, task["id"], "input")
    question = box.task(task["id"])["questions"][0]
    assert question["state"] == "open" and question["fields"][0]["name"] == "city"
    assert question["fields"][0]["why"] == "the report is about it"
    response = box.api.post(f"/api/tasks/{task['id']}/continue", {"inputs": {"city": "Oslo"}}, format="json")
    assert response.status_code == 200, response.json()
    view = box.wait_state(task["id"], "done", "failed", "cancelled")
    assert view["state"] == "done", view["error"]
    assert any(e["summary"] == "city is Oslo" for e in events_of(box, task["id"], "step"))


def test_box_need_human_waits_until_a_person_continues(box: Any) -> None:
    task = box.create(title="captcha", worker="command", prompt="p",
                      command=sh("box need-human 'solve the captcha on the login page' && box step past-the-wall"))
    waiting(box, task["id"], "human")
    response = box.api.post(f"/api/tasks/{task['id']}/continue", {"answer": "done it"}, format="json")
    assert response.status_code == 200, response.json()
    view = box.wait_state(task["id"], "done", "failed", "cancelled")
    assert view["state"] == "done", view["error"]
    assert any(e["summary"] == "past-the-wall" for e in events_of(box, task["id"], "step"))

    assert Run.objects.filter(task_id=task["id"]).count() == 1  # the same process went on: no re-run


def test_another_task_cannot_use_a_held_tasks_broker(box: Any) -> None:
    if not describe_isolation()["sandbox"]:
        pytest.skip("without the sandbox every task runs as the box's own user")
    held = box.create(title="holder", worker="command", prompt="p", command=sh("box approve 'wait here'"))
    waiting(box, held["id"], "approval")
    target = socket_path(held["id"])
    attacker = box.create(title="attacker", worker="command", prompt="p",
                          command=sh(f"id -u; BOX_BROKER_SOCKET={target} box step pwned; echo \"exit=$?\""))
    view = box.wait_state(attacker["id"], "done", "failed", "cancelled")
    outputs = [e["summary"] for e in events_of(box, attacker["id"], "output")]
    assert outputs[0] != "0"  # the attacker ran as its own user, not root
    assert "exit=3" in outputs, (view, outputs)
    assert not any(e["summary"] == "pwned" for e in events_of(box, held["id"], "step"))
    assert box.api.post(f"/api/tasks/{held['id']}/cancel").status_code == 200

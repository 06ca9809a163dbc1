"""Checkpoints and payment modes: a checkpoint pauses; `continuable` says whether approving may
go on. stop_at_payment (the default) stops at a payment as a non-continuable checkpoint, which
only cancel releases; fill_then_approve needs constraints.origins and pauses as an approval."""
from __future__ import annotations

from tasks.models import Task
from tests.factories import flow
from tests.pauses.helpers import cont, pending_approval, post, report

PAY = flow(
    {"write": {"path": "form.txt", "content": "card ${card number}"}},
    {"checkpoint": {"reason": "the pay button", "payment": True}},
    {"run": "echo paid >> log.txt"},
)
CARD = {"card number": "4111 1111 1111 1111"}


def test_a_checkpoint_pauses_and_approving_goes_on(box):
    spec = flow({"run": "echo one >> log.txt"}, {"checkpoint": "look before going on"},
                {"run": "echo two >> log.txt"}, {"run": "cat log.txt", "save": "log"})
    task = box.create(title="cp", flow=spec)
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "checkpoint" and view["continuable"] is True and view["final"] is False
    assert view["next"][:3] == ["continue", "approve", "deny"]
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "checkpoint" and approval["guard"]["step"] == 1
    assert cont(box, task["id"], approve=True).status_code == 200
    box.wait_state(task["id"], "done")
    assert report(box, task["id"])["records"]["log"] == "one\ntwo"


def test_denying_a_checkpoint_cancels(box):
    task = box.create(title="cp", flow=flow({"checkpoint": "stop here"}, {"run": "true"}))
    box.wait_state(task["id"], "waiting")
    approval = pending_approval(box, task["id"])
    assert post(box, f"/api/approvals/{approval['id']}/deny").status_code == 200
    assert box.task(task["id"])["state"] == "cancelled"


def test_a_non_continuable_checkpoint_is_final_like_and_only_cancel_or_undo_releases_it(box):
    task = box.create(title="cp", flow=flow({"checkpoint": {"reason": "hand over", "continuable": False}}, {"run": "true"}))
    view = box.wait_state(task["id"], "waiting")
    assert view["continuable"] is False and view["final"] is True
    assert view["next"] == ["cancel", "undo", "diff", "report"]
    assert box.task(task["id"])["approvals"] == []
    for body in ({"approve": True}, {"approve": False}, {}):
        response = cont(box, task["id"], **body)
        assert response.status_code == 409, body
    assert box.task(task["id"])["state"] == "waiting"
    cancelled = post(box, f"/api/tasks/{task['id']}/cancel").json()
    assert cancelled["state"] == "cancelled" and cancelled["final"] is True


def test_stop_at_payment_is_the_default_and_never_pays(box):
    task = box.create(title="buy", flow=PAY, facts=CARD)
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "checkpoint" and view["continuable"] is False and view["final"] is True
    assert "paying is for a person" in view["pause"]["message"]
    assert cont(box, task["id"], approve=True).status_code == 409
    steps = report(box, task["id"])["steps"]
    assert [s["outcome"] for s in steps] == ["done", "waiting for checkpoint"]
    assert post(box, f"/api/tasks/{task['id']}/cancel").status_code == 200
    assert "log" not in report(box, task["id"])["records"]


def test_fill_then_approve_needs_origins(box):
    response = box.api.post("/api/tasks", {"title": "buy", "flow": PAY, "facts": CARD,
                                           "constraints": {"payment": "fill_then_approve"}}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "ORIGINS_REQUIRED" and response.json()["field"] == "constraints.origins"

    assert not Task.objects.exists()


def test_fill_then_approve_fills_then_waits_for_approval_to_pay(box):
    task = box.create(title="buy", flow=PAY, facts=CARD,
                      constraints={"payment": "fill_then_approve", "origins": ["https://shop.example.com"]})
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "approval"
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "payment" and approval["summary"] == "the pay button"
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    box.wait_state(task["id"], "done")

"""A plain-language ask parked for a plan is counted apart from the active-task slots."""
from __future__ import annotations

from boxsite.models import BoxSettings
from tests.factories import flow


def test_a_parked_ask_does_not_hold_one_of_the_active_task_slots(box):
    row = BoxSettings.current()
    row.max_active_tasks = 1
    row.save()
    parked = box.create(title="plain", prompt="book a table")
    assert box.wait_state(parked["id"], "waiting")["waitingFor"] == "plan"
    held = box.create(title="holds the slot", flow=flow({"approve": "ok?"}))
    box.wait_state(held["id"], "waiting")
    refused = box.api.post("/api/tasks", {"title": "no room", "flow": flow({"run": "true"})}, format="json")
    assert refused.status_code == 429 and refused.json()["code"] == "TOO_MANY_TASKS"

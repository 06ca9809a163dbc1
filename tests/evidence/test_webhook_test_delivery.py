"""A webhook test delivery is signed and received like a real one: it starts a task from the
template, shows up in the deliveries, and is refused for a paused hook or a file trigger."""
from __future__ import annotations

from rest_framework.test import APIClient

from tests.factories import make_owner

TEMPLATE = {"title": "hook ${payload.action}", "prompt": "look at ${payload.number}"}


def make_hook(box, name="github"):
    response = box.api.post("/api/triggers", {"name": name, "kind": "webhook", "template": TEMPLATE}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_a_test_delivery_starts_a_task_through_the_real_path(box):
    hook = make_hook(box)
    response = box.api.post(f"/api/triggers/{hook['id']}/test", {"payload": {"action": "opened", "number": 7}}, format="json")
    assert response.status_code == 202, response.json()
    sent = response.json()
    assert sent["duplicate"] is False and sent["delivery"]
    task = box.task(sent["task"])
    assert task["title"] == "hook opened" and task["prompt"] == "look at 7"
    default = box.api.post(f"/api/triggers/{hook['id']}/test", {}, format="json").json()
    assert box.task(default["task"])["title"] == "hook test" and default["task"] != sent["task"]
    deliveries = box.api.get(f"/api/triggers/{hook['id']}/deliveries").json()["results"]
    assert len(deliveries) == 2
    assert {d["taskTitle"] for d in deliveries} == {"hook opened", "hook test"}  # titles, not only ids
    assert all(d["taskState"] for d in deliveries)


def test_a_test_delivery_is_refused_where_a_real_one_would_be(box, tmp_path):
    hook = make_hook(box)
    box.api.post(f"/api/triggers/{hook['id']}/pause")
    paused = box.api.post(f"/api/triggers/{hook['id']}/test", {}, format="json")
    assert paused.status_code == 409 and paused.json()["field"] == "paused"
    bad = box.api.post(f"/api/triggers/{hook['id']}/test", {"payload": [1]}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "payload"
    folder = box.api.post("/api/triggers", {"name": "drop", "kind": "file", "folder": str(tmp_path),
                                            "template": {"title": "t", "prompt": "p"}}, format="json").json()
    not_hook = box.api.post(f"/api/triggers/{folder['id']}/test", {}, format="json")
    assert not_hook.status_code == 400 and not_hook.json()["field"] == "kind"
    other = APIClient()
    other.force_login(make_owner())
    assert other.post(f"/api/triggers/{hook['id']}/test", {}, format="json").status_code == 404

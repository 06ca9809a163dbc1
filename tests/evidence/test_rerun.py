"""Run again: a new task from an ended task's spec (secret facts carried over, never shown),
with any field replaced; refused for live tasks, other owners' tasks and bad fields."""
from __future__ import annotations

from rest_framework.test import APIClient

from tests.factories import flow, make_owner
from tests.layers.conftest import read

SECRET = "pa55-word-for-the-rerun"


def rerun(box, task_id, body=None):
    return box.api.post(f"/api/tasks/{task_id}/rerun", body if body is not None else {}, format="json")


def test_an_ended_task_runs_again_from_the_same_spec_with_its_secrets(box):
    first = box.create(title="greet", flow=flow({"write": {"path": "out.txt", "content": "${greeting} ${token}"}}),
                       facts={"greeting": "hello", "token": SECRET}, secretFacts=["token"], hosts=["example.org"])
    done = box.wait_state(first["id"], "done")
    assert "rerun" in done["next"]
    box.api.post(f"/api/tasks/{first['id']}/undo")
    response = rerun(box, first["id"])
    assert response.status_code == 201, response.json()
    again = response.json()
    assert again["id"] != first["id"] and again["title"] == "greet" and again["flow"] == first["flow"]
    assert again["hosts"] == ["example.org"] and again["secretFacts"] == ["token"]
    assert again["facts"] == {"greeting": "hello", "token": "${token}"}
    assert SECRET not in str(response.json())
    box.wait_state(again["id"], "done")
    assert read(box, "out.txt") == f"hello {SECRET}"


def test_a_rerun_can_change_fields_and_is_checked_whole(box):
    first = box.create(title="count", flow=flow({"run": "echo one"}))
    box.wait_state(first["id"], "done")
    edited = rerun(box, first["id"], {"title": "count again", "flow": flow({"run": "echo two"})}).json()
    assert edited["title"] == "count again" and edited["flow"]["steps"] == [{"run": "echo two"}]
    bad = rerun(box, first["id"], {"budget": 5})
    assert bad.status_code == 400 and bad.json()["field"] == "budget"
    not_object = box.api.post(f"/api/tasks/{first['id']}/rerun", ["x"], format="json")
    assert not_object.status_code == 400 and not_object.json()["code"] == "INVALID_REQUEST"


def test_a_live_task_or_anothers_task_does_not_run_again(box):
    waiting = box.create(title="waits", flow=flow({"approve": "ok?"}))
    box.wait_state(waiting["id"], "waiting")
    response = rerun(box, waiting["id"])
    assert response.status_code == 409 and response.json()["code"] == "CONFLICT"
    assert "rerun" not in box.task(waiting["id"])["next"]
    other = APIClient()
    other.force_login(make_owner())
    assert other.post(f"/api/tasks/{waiting['id']}/rerun", {}, format="json").status_code == 404

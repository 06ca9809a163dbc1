"""Run now: a schedule's task starts at once, recorded as a firing; its timetable is unchanged."""
from __future__ import annotations

from rest_framework.test import APIClient

from tests.factories import flow, make_owner


def test_run_now_starts_the_task_and_leaves_the_timetable_alone(box):
    schedule = box.api.post("/api/schedules", {"name": "nightly", "cron": "0 3 * * *", "template": {
        "title": "nightly build", "flow": flow({"write": {"path": "built.txt", "content": "ok"}})}}, format="json").json()
    response = box.api.post(f"/api/schedules/{schedule['id']}/run")
    assert response.status_code == 201, response.json()
    task = response.json()
    assert task["title"] == "nightly build" and task["source"].startswith("schedule")
    assert box.wait_state(task["id"], "done")["state"] == "done"
    notes = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "note"]
    assert "started by hand from schedule 'nightly' (Run now)" in notes
    firings = box.api.get(f"/api/schedules/{schedule['id']}/firings").json()["results"]
    assert [(f["task"], f["taskTitle"], f["taskState"]) for f in firings] == [(task["id"], "nightly build", "done")]
    after = box.api.get(f"/api/schedules/{schedule['id']}").json()
    assert after["nextRunAt"] == schedule["nextRunAt"] and after["nextRunAt"] is not None  # 03:00 stays 03:00
    # A run by hand is a run: the schedule's last run is it, and names its task.
    assert schedule["lastRunAt"] is None
    assert after["lastRunAt"] is not None and after["lastTask"] == task["id"]
    assert after["lastRunAt"] == firings[0]["firedAt"]


def test_run_now_answers_404_for_an_unknown_or_anothers_schedule(box):
    schedule = box.api.post("/api/schedules", {"name": "mine", "intervalSeconds": 3600,
                                               "template": {"title": "t", "flow": flow({"run": "true"})}}, format="json").json()
    assert box.api.post("/api/schedules/999999/run").json()["code"] == "NOT_FOUND"
    other = APIClient()
    other.force_login(make_owner())
    assert other.post(f"/api/schedules/{schedule['id']}/run").status_code == 404

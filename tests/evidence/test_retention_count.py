"""Retention by count: only the newest ended tasks keep their history; live work is untouched,
artifacts go with their task, and the box's log says what was removed."""
from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from boxsite.models import BoxSettings
from tasks.layers import paths
from tasks.models import Task
from tasks.retention import prune_expired
from tasks.run import artifacts
from tests.factories import flow


def _finished(task_id: str, minutes_ago: int) -> None:
    Task.objects.filter(pk=task_id).update(finished_at=timezone.now() - timedelta(minutes=minutes_ago))


def test_past_the_count_ended_tasks_are_pruned_and_live_ones_never(box, caplog):
    row = BoxSettings.current()
    row.retention_days = 3650  # the window is not what prunes here
    row.retention_count = 2
    row.save()
    waiting = box.create(title="waiting", flow=flow({"approve": "ok?"}))
    box.wait_state(waiting["id"], "waiting")
    old_done = box.create(title="old done", flow=flow({"run": "echo old output"}, {"write": {"path": "o.txt", "content": "o"}}))
    old_failed = box.create(title="old failed", flow=flow({"run": "echo bad >&2; exit 2"}))
    new_done = box.create(title="new done", flow=flow({"run": "echo new output"}))
    new_failed = box.create(title="new failed", flow=flow({"run": "exit 1"}))
    for task, state in ((old_done, "done"), (old_failed, "failed"), (new_done, "done"), (new_failed, "failed")):
        box.wait_state(task["id"], state)
    for minutes, task in enumerate((new_failed, new_done, old_failed, old_done), start=1):
        _finished(task["id"], minutes * 10)
    assert artifacts.artifact_dir(old_done["id"]).is_dir() and artifacts.artifact_dir(old_failed["id"]).is_dir()

    with caplog.at_level(logging.INFO, logger="tasks.retention"):
        pruned = prune_expired()

    assert pruned.forgotten == [old_failed["id"]] and pruned.history == [old_done["id"]]
    assert box.api.get(f"/api/tasks/{old_failed['id']}").status_code == 404
    assert not artifacts.artifact_dir(old_failed["id"]).exists()
    old = box.task(old_done["id"])
    assert old["state"] == "done" and old["historyPrunedAt"] and paths.layer_dir(old_done["id"]).exists()
    assert [e["kind"] for e in box.events(old_done["id"])] == ["note"]
    assert not artifacts.artifact_dir(old_done["id"]).exists()
    report = box.api.get(f"/api/tasks/{old_done['id']}/report").json()
    assert report["runs"] == [] and report["steps"] == []
    for kept in (new_done, new_failed):
        assert any(e["kind"] == "step_result" for e in box.events(kept["id"]))
    assert artifacts.artifact_dir(new_done["id"]).is_dir()
    assert box.task(waiting["id"])["state"] == "waiting" and box.events(waiting["id"])
    message = " ".join(r.getMessage() for r in caplog.records if r.name == "tasks.retention")
    assert old_failed["id"] in message and old_done["id"] in message and "forgot 1" in message
    again = prune_expired()
    assert again.forgotten == [] and again.history == []


def test_the_count_is_a_setting_refused_out_of_range(box):
    assert box.api.patch("/api/settings", {"retentionCount": 5}, format="json").json()["retentionCount"] == 5
    for bad in (0, -1, "ten", 2_000_000, True):
        response = box.api.patch("/api/settings", {"retentionCount": bad}, format="json")
        assert response.status_code == 400 and response.json()["field"] == "retentionCount", bad

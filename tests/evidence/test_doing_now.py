"""A task that ended does nothing any more: "Doing now" is empty after a cancel, and an undone
task's progress is back to nothing (its changes are gone)."""
from __future__ import annotations

from tests.factories import flow


def test_a_cancelled_task_is_doing_nothing(box):
    task = box.create(title="waits", flow=flow({"run": "true"}, {"approve": "go on?"}, {"run": "true"}))
    waiting = box.wait_state(task["id"], "waiting")
    assert waiting["step"]  # "Doing now" names a step while it waits
    assert box.api.post(f"/api/tasks/{task['id']}/cancel").status_code == 200
    cancelled = box.wait_state(task["id"], "cancelled")
    assert cancelled["step"] == ""


def test_an_undone_task_shows_no_progress_and_is_doing_nothing(box):
    task = box.create(title="writes", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    done = box.wait_state(task["id"], "done")
    assert done["progress"] == 1.0 and done["step"] == ""
    assert box.api.post(f"/api/tasks/{task['id']}/undo").status_code == 200
    undone = box.wait_state(task["id"], "undone")
    assert undone["progress"] == 0.0 and undone["step"] == ""

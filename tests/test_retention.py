"""Retention forgets old tasks whose changes are in no workspace, and keeps the rest."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from boxsite.models import BoxSettings
from tasks.layers import paths
from tasks.models import Task, TaskEvent
from tasks.retention import prune_expired
from tests.factories import flow


def _age(task_id: str, days: int) -> None:
    Task.objects.filter(pk=task_id).update(finished_at=timezone.now() - timedelta(days=days))


def test_old_failed_cancelled_and_undone_tasks_are_forgotten_done_ones_kept(box):
    settings_row = BoxSettings.current()
    settings_row.retention_days = 30
    settings_row.save()
    failed = box.create(title="fails", flow=flow({"write": {"path": "f.txt", "content": "f"}}, {"run": "exit 4"}))
    box.wait_state(failed["id"], "failed")
    done = box.create(title="done", flow=flow({"write": {"path": "d.txt", "content": "d"}}))
    box.wait_state(done["id"], "done")
    undone = box.create(title="undone", flow=flow({"write": {"path": "u.txt", "content": "u"}}))
    box.wait_state(undone["id"], "done")
    box.api.post(f"/api/tasks/{undone['id']}/undo")
    recent = box.create(title="recent failure", flow=flow({"run": "exit 1"}))
    box.wait_state(recent["id"], "failed")
    for task_id in (failed["id"], done["id"], undone["id"]):
        _age(task_id, 40)
    _age(recent["id"], 5)

    pruned = prune_expired()

    assert sorted(pruned.forgotten) == sorted([failed["id"], undone["id"]])
    assert pruned.history == [done["id"]]
    for gone in pruned.forgotten:
        assert box.api.get(f"/api/tasks/{gone}").status_code == 404
        assert not TaskEvent.objects.filter(task_id=gone).exists()
        assert not paths.layer_dir(gone).exists() and not paths.task_dir(gone).exists()
    kept = box.task(done["id"])
    assert kept["state"] == "done" and kept["historyPrunedAt"]  # its change is part of the workspace
    assert paths.layer_dir(done["id"]).exists()
    assert [e["data"].get("retention") for e in box.events(done["id"])] == [True]  # one line says what went
    assert box.task(recent["id"])["state"] == "failed"
    again = prune_expired()
    assert again.forgotten == [] and again.history == []  # nothing more to do: quiet

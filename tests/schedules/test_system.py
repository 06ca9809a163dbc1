"""Built-in schedules: the box's own jobs (retention, compaction) kept as system schedules,
reconciled at start-up, read-only, fired by the tick, with attention when they keep failing."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from boxsite import scheduler
from boxsite.models import BoxSettings
from schedules import system
from schedules.models import Firing, Schedule
from schedules.tick import fire_due
from tasks.models import Task
from tests.conftest import Box
from tests.factories import flow


def builtin(box: Box) -> dict[str, dict[str, Any]]:
    listed = box.api.get("/api/schedules", {"origin": "system"}).json()["results"]
    return {s["name"]: s for s in listed}


def test_start_up_creates_the_built_in_schedules_read_only(box: Box) -> None:
    assert scheduler.run_phases(scheduler.start_phases()) == []
    shown = builtin(box)
    assert set(shown) == {"box-retention", "box-compaction"}
    for view in shown.values():
        assert view["system"] is True and view["origin"] == "system" and view["status"] == "active"
        assert view["template"]["job"] in ("retention", "compaction") and view["nextRunAt"]
        sid = view["id"]
        assert box.api.patch(f"/api/schedules/{sid}", {"intervalSeconds": 60}, format="json").status_code == 403
        assert box.api.delete(f"/api/schedules/{sid}").status_code == 403
        assert box.api.post(f"/api/schedules/{sid}/run").status_code == 409
    assert system.reconcile() == 2 and Schedule.objects.count() == 2  # again: nothing new


def test_reconcile_repairs_a_stale_or_disabled_built_in_schedule(box: Box) -> None:
    system.reconcile()
    Schedule.objects.filter(name="box-retention").update(
        template={"title": "old", "job": "retention-v0"}, interval_seconds=5, enabled=False, next_run_at=None,
        disabled_reason="broken")
    system.reconcile()
    repaired = Schedule.objects.get(name="box-retention")
    assert repaired.template == system.JOBS["retention"].template and repaired.interval_seconds == 3600
    assert repaired.enabled and repaired.next_run_at is not None and repaired.disabled_reason == ""


def test_the_retention_schedule_forgets_old_tasks_when_it_fires(box: Box, settings: Any) -> None:
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}  # the task runs here, to its end
    settings_row = BoxSettings.current()
    settings_row.retention_days = 30
    settings_row.save()
    old = box.create(title="fails", flow=flow({"delete": {"path": "missing.txt"}}))
    box.wait_state(old["id"], "failed")
    Task.objects.filter(pk=old["id"]).update(finished_at=timezone.now() - timedelta(days=40))
    system.reconcile()
    schedule = Schedule.objects.get(name="box-retention")
    assert schedule.next_run_at is not None
    fire_due(schedule.next_run_at + timedelta(seconds=1))
    assert not Task.objects.filter(pk=old["id"]).exists()
    firing = Firing.objects.get(schedule=schedule)
    assert firing.task_id is None and firing.error == ""
    schedule.refresh_from_db()
    assert schedule.next_run_at is not None and schedule.next_run_at > firing.fired_at


def test_a_failing_built_in_job_stays_enabled_and_needs_attention(box: Box, monkeypatch: Any) -> None:
    system.reconcile()

    def broken() -> None:
        raise OSError("the disk is read-only")

    monkeypatch.setattr(system, "JOBS", {**system.JOBS, "compaction": system.Job("compaction", "c", 3600, broken)})
    schedule = Schedule.objects.get(name="box-compaction")
    now = schedule.next_run_at
    assert now is not None
    for _ in range(5):
        fire_due(now)
        schedule.refresh_from_db()
        assert schedule.backoff_until is not None
        now = schedule.backoff_until + timedelta(seconds=1)  # retried after the backoff, not an hour later
    view = builtin(box)["box-compaction"]
    assert view["enabled"] is True and view["status"] == "attention" and view["consecutiveFailures"] == 5
    assert "the disk is read-only" in view["lastError"]
    monkeypatch.undo()
    fire_due(now)
    view = builtin(box)["box-compaction"]
    assert view["status"] == "active" and view["consecutiveFailures"] == 0

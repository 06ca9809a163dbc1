"""The scheduler's schedule phase: each occurrence fires exactly once, missed ones coalesce,
failures back off, and a healthy tick with nothing due is silent."""
from __future__ import annotations

import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from boxsite.models import BoxSettings
from schedules import services
from schedules.models import Schedule
from schedules.tick import fire_due
from tasks.models import Task, Workspace
from tests.conftest import Box
from tests.schedules.conftest import at, get_schedule, make_schedule, run_scheduler_once, tasks_from

HOURLY = 3600


def test_a_due_schedule_fires_one_ordinary_task_named_after_it(box: Box) -> None:
    schedule = make_schedule(box, name="news", intervalSeconds=HOURLY)
    due = at(schedule["nextRunAt"])
    assert fire_due(due - timedelta(seconds=1)) == 0
    assert fire_due(due) == 1
    assert fire_due(due) == 0  # the same occurrence, a repeated tick

    [task] = tasks_from(box, "schedule:news")
    assert task["title"] == "summarise the news" and task["state"] == "queued"
    view = get_schedule(box, schedule["id"])
    assert view["lastTask"] == task["id"]
    assert at(view["nextRunAt"]) == due + timedelta(seconds=HOURLY)
    assert view["lastFiring"]["skipped"] == 0
    note = [e for e in box.events(task["id"]) if e["kind"] == "note"][0]
    assert note["data"]["schedule"] == "news" and note["data"]["skipped"] == 0


def test_downtime_coalesces_into_one_catch_up_firing_that_says_how_many_were_skipped(box: Box) -> None:
    schedule = make_schedule(box, name="digest", cron="0 * * * *", timezone="Europe/Berlin")
    first = at(schedule["nextRunAt"])
    back_up = first + timedelta(hours=4, minutes=20)  # the box was off for five occurrences

    assert fire_due(back_up) == 1
    [task] = tasks_from(box, "schedule:digest")
    note = [e for e in box.events(task["id"]) if e["kind"] == "note"][0]
    assert note["data"]["catchUp"] is True and note["data"]["skipped"] == 4
    assert "4 missed" in note["summary"]
    view = get_schedule(box, schedule["id"])
    assert view["lastFiring"]["skipped"] == 4
    assert at(view["nextRunAt"]) == first + timedelta(hours=5)  # the next future occurrence
    assert fire_due(back_up) == 0


def test_the_real_scheduler_process_fires_a_catch_up_after_a_restart(box: Box, tmp_path: Path) -> None:
    schedule = make_schedule(box, name="restart", intervalSeconds=HOURLY)
    # The box was off for five hours: the cursor is far in the past when the scheduler starts.
    Schedule.objects.filter(pk=schedule["id"]).update(next_run_at=timezone.now() - timedelta(hours=5) + timedelta(minutes=1))

    run_scheduler_once(tmp_path)
    run_scheduler_once(tmp_path)  # a second start owes nothing more

    [task] = tasks_from(box, "schedule:restart")
    view = get_schedule(box, schedule["id"])
    assert view["lastFiring"]["skipped"] == 4 and view["lastTask"] == task["id"]
    assert at(view["nextRunAt"]) > timezone.now()


@pytest.mark.parametrize("rounds", [4])
def test_two_schedulers_racing_fire_each_occurrence_once(box: Box, rounds: int) -> None:
    schedule = make_schedule(box, name="race", intervalSeconds=HOURLY)
    due = at(schedule["nextRunAt"])
    for round_no in range(rounds):
        now = due + timedelta(seconds=HOURLY * round_no)
        barrier = threading.Barrier(2)
        fired: list[int] = []
        errors: list[BaseException] = []

        def scheduler() -> None:
            try:
                barrier.wait(timeout=10)
                fired.append(fire_due(now))
            except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
                errors.append(exc)
            finally:
                connections.close_all()  # this thread's own connection

        threads = [threading.Thread(target=scheduler) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        assert sorted(fired) == [0, 1], f"round {round_no}: {fired}"
    assert len(tasks_from(box, "schedule:race")) == rounds
    assert Schedule.objects.get(pk=schedule["id"]).firings.count() == rounds


def test_a_healthy_tick_with_nothing_due_writes_nothing_and_logs_nothing(box: Box, caplog: Any) -> None:
    schedule = make_schedule(box, name="quiet", intervalSeconds=HOURLY)
    before = Schedule.objects.get(pk=schedule["id"]).updated_at
    caplog.set_level(logging.DEBUG)
    with CaptureQueriesContext(connection) as queries:
        assert fire_due(at(schedule["nextRunAt"]) - timedelta(seconds=1)) == 0
    writes = [q["sql"] for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith("SELECT")]
    assert writes == [] and len(queries.captured_queries) == 1
    assert [r for r in caplog.records if r.name.startswith("box")] == []
    assert Schedule.objects.get(pk=schedule["id"]).updated_at == before


def _breakable_schedule(box: Box, name: str, tmp_path: Path, **cadence: Any) -> dict[str, Any]:
    """A schedule whose template stops validating once the 'scratch' workspace is removed."""
    Workspace.objects.create(name="scratch", base_dir=str(tmp_path))
    return make_schedule(box, name=name, template={"title": "t", "prompt": "p", "workspace": "scratch"}, **cadence)


def test_failures_back_off_exponentially_and_disable_a_user_schedule_after_five(box: Box, tmp_path: Path, settings: Any) -> None:
    settings.BOX_SCHEDULE_BACKOFF_SECONDS = 30.0
    schedule = _breakable_schedule(box, "fragile", tmp_path, intervalSeconds=HOURLY)
    Workspace.objects.filter(name="scratch").delete()
    now = at(schedule["nextRunAt"])
    waits = []
    for attempt in range(1, 6):
        assert fire_due(now) == 0
        view = get_schedule(box, schedule["id"])
        assert view["consecutiveFailures"] == attempt
        assert "unknown workspace 'scratch'" in view["lastError"]
        if attempt < 5:
            retry_at = at(view["backoffUntil"])
            waits.append((retry_at - now).total_seconds())
            assert fire_due(retry_at - timedelta(seconds=1)) == 0  # still backing off
            assert get_schedule(box, schedule["id"])["consecutiveFailures"] == attempt
            now = retry_at
    assert waits == [30, 60, 120, 240]
    assert view["status"] == "disabled" and view["enabled"] is False and view["nextRunAt"] is None
    assert "5 consecutive failed firings" in view["disabledReason"]
    assert fire_due(now + timedelta(days=1)) == 0
    assert tasks_from(box, "schedule:fragile") == []

    # Fixed and re-enabled by the owner: it fires again, from a fresh count.
    Workspace.objects.create(name="scratch", base_dir=str(tmp_path))
    resumed = box.api.post(f"/api/schedules/{schedule['id']}/resume").json()
    assert resumed["status"] == "active" and resumed["consecutiveFailures"] == 0 and resumed["disabledReason"] is None
    assert fire_due(at(resumed["nextRunAt"])) == 1


def test_a_failing_system_schedule_stays_enabled_needs_attention_and_backs_off_within_a_bound(
    box: Box, tmp_path: Path, settings: Any
) -> None:
    settings.BOX_SCHEDULE_BACKOFF_SECONDS = 30.0
    settings.BOX_SCHEDULE_BACKOFF_MAX_SECONDS = 300.0
    Workspace.objects.create(name="scratch", base_dir=str(tmp_path))
    schedule = services.ensure_system_schedule(
        box.owner, "prune", interval_seconds=HOURLY, template={"title": "prune", "prompt": "p", "workspace": "scratch"}
    )
    Workspace.objects.filter(name="scratch").delete()
    now = schedule.next_run_at
    assert now is not None
    for _ in range(9):
        fire_due(now)
        view = get_schedule(box, schedule.pk)
        wait = (at(view["backoffUntil"]) - now).total_seconds()
        assert 0 < wait <= 300
        now = at(view["backoffUntil"])
    assert view["enabled"] is True and view["system"] is True and view["origin"] == "system"
    assert view["needsAttention"] is True and view["status"] == "attention" and view["consecutiveFailures"] == 9
    listed = box.api.get("/api/schedules", {"status": "attention"}).json()["results"]
    assert [s["id"] for s in listed] == [schedule.pk]

    Workspace.objects.create(name="scratch", base_dir=str(tmp_path))
    assert fire_due(now) == 1
    view = get_schedule(box, schedule.pk)
    assert view["needsAttention"] is False and view["consecutiveFailures"] == 0 and view["status"] == "active"


def test_a_paused_schedule_does_not_fire_and_resuming_owes_nothing_for_the_pause(box: Box) -> None:
    schedule = make_schedule(box, name="pausable", intervalSeconds=HOURLY)
    due = at(schedule["nextRunAt"])
    paused = box.api.post(f"/api/schedules/{schedule['id']}/pause").json()
    assert paused["status"] == "paused" and paused["nextRunAt"] is None
    assert fire_due(due + timedelta(hours=10)) == 0

    resumed = box.api.post(f"/api/schedules/{schedule['id']}/resume").json()
    assert resumed["status"] == "active"
    next_run = at(resumed["nextRunAt"])
    assert next_run > timezone.now()
    assert fire_due(next_run) == 1
    assert get_schedule(box, schedule["id"])["lastFiring"]["skipped"] == 0
    assert Task.objects.filter(source="schedule:pausable").count() == 1


def test_a_full_box_defers_a_firing_without_counting_it_as_a_failure(box: Box, settings: Any) -> None:
    settings.BOX_SCHEDULE_BACKOFF_SECONDS = 30.0
    schedule = make_schedule(box, name="busy", intervalSeconds=HOURLY)
    BoxSettings.objects.update_or_create(pk=1, defaults={"max_active_tasks": 0})
    now = at(schedule["nextRunAt"])
    for _ in range(7):
        assert fire_due(now) == 0
        view = get_schedule(box, schedule["id"])
        now = at(view["backoffUntil"])
    assert view["status"] == "active" and view["consecutiveFailures"] == 0
    assert "tasks are already queued" in view["lastError"]

    BoxSettings.objects.filter(pk=1).update(max_active_tasks=32)
    assert fire_due(now) == 1

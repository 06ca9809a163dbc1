"""The schedule and trigger API: validation in the box's error shape, edits, filters, and a
cursor that binds its sort and pages correctly through NULL next/last run times."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from boxsite.core.errors import Forbidden
from boxsite.core.principal import Principal
from schedules import services
from schedules.models import Schedule
from schedules.tick import fire_due
from tasks.models import Task
from tests.conftest import Box
from tests.factories import make_owner
from tests.schedules.conftest import at, get_schedule, make_schedule


@pytest.mark.parametrize(("body", "status", "code", "field"), [
    ({"name": "x", "cron": "bad cron", "template": {"title": "t", "prompt": "p"}}, 400, "INVALID_REQUEST", "cron"),
    ({"name": "x", "cron": "* * * * *", "timezone": "Nowhere/Land", "template": {"title": "t", "prompt": "p"}}, 400, "INVALID_REQUEST", "timezone"),
    ({"name": "x", "intervalSeconds": 3600, "template": {"title": "t", "budget": 5, "prompt": "p"}}, 400, "INVALID_SPEC", "template.budget"),
    ({"name": "x", "intervalSeconds": 3600, "template": {"title": "t", "prompt": "p", "workspace": "nope"}}, 400, "INVALID_SPEC", "template.workspace"),
    ({"name": "x", "intervalSeconds": 3600, "template": {"title": "t", "prompt": "p", "source": "api"}}, 400, "INVALID_SPEC", "template.source"),
    ({"name": "x", "intervalSeconds": 3600, "template": {"title": "t", "flow": {"steps": [{"teleport": 1}]}}}, 400, "INVALID_FLOW", None),
    ({"name": "x", "intervalSeconds": 3600, "template": {"title": "t", "prompt": "p", "folder": "/tmp"}}, 403, "FORBIDDEN", "template.folders"),
    ({"name": "Bad Name", "intervalSeconds": 3600, "template": {"title": "t", "prompt": "p"}}, 400, "INVALID_REQUEST", "name"),
    ({"name": "x", "every": "day", "template": {"title": "t", "prompt": "p"}}, 400, "INVALID_REQUEST", "every"),
])
def test_a_bad_schedule_is_refused_with_a_stable_code_and_field_and_nothing_is_created(
    box: Box, body: dict[str, Any], status: int, code: str, field: str | None
) -> None:
    response = box.api.post("/api/schedules", body, format="json")
    assert response.status_code == status, response.json()
    error = response.json()
    assert error["code"] == code and set(error) >= {"code", "message", "field"}
    if field is not None:
        assert error["field"] == field
    assert Schedule.objects.count() == 0 and Task.objects.count() == 0


def test_a_schedule_records_who_made_it_and_names_must_be_unique(box: Box) -> None:
    created = make_schedule(box, name="morning", cron="0 7 * * 1-5", timezone="Europe/Berlin")
    assert created["origin"] == "owner" and created["system"] is False and created["status"] == "active"
    assert created["source"] == "schedule:morning" and created["cadence"] == "cron '0 7 * * 1-5' (Europe/Berlin)"
    local = at(created["nextRunAt"]).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (7, 0) and local.weekday() < 5
    again = box.api.post("/api/schedules", {"name": "morning", "intervalSeconds": 60,
                                            "template": {"title": "t", "prompt": "p"}}, format="json")
    assert again.status_code == 409 and again.json()["field"] == "name"


def test_a_schedule_made_by_a_task_records_the_task_and_cannot_touch_system_schedules(box: Box) -> None:
    task = Task.objects.get(pk=box.create(title="planner", prompt="plan")["id"])
    principal = Principal.system(box.owner, via="task")
    made = services.create_schedule(principal, {"name": "from-task", "intervalSeconds": 600,
                                                "template": {"title": "t", "prompt": "p"}}, by_task=task)
    view = get_schedule(box, made.pk)
    assert view["origin"] == "task" and view["createdByTask"] == task.pk

    system = services.ensure_system_schedule(box.owner, "retention", interval_seconds=86400,
                                             template={"title": "prune", "prompt": "prune"})

    for verb in (services.pause_schedule, services.delete_schedule):
        with pytest.raises(Forbidden):
            verb(principal, system.pk, by_task=task)
    assert box.api.delete(f"/api/schedules/{system.pk}").status_code == 403
    assert box.api.patch(f"/api/schedules/{system.pk}", {"intervalSeconds": 60}, format="json").status_code == 403
    assert box.api.post(f"/api/schedules/{system.pk}/pause").json()["status"] == "paused"  # the owner may


def test_editing_the_cadence_moves_the_cursor_and_editing_the_template_revalidates(box: Box) -> None:
    created = make_schedule(box, name="edit-me", intervalSeconds=3600)
    edited = box.api.patch(f"/api/schedules/{created['id']}", {"cron": "15 3 * * *", "timezone": "Asia/Tokyo"},
                           format="json").json()
    assert edited["cron"] == "15 3 * * *" and edited["intervalSeconds"] is None and edited["version"] == 2
    local = at(edited["nextRunAt"]).astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert (local.hour, local.minute) == (3, 15)

    bad = box.api.patch(f"/api/schedules/{created['id']}", {"template": {"title": "t"}}, format="json")
    assert bad.status_code == 400 and bad.json()["field"] == "template.prompt"
    stale = box.api.patch(f"/api/schedules/{created['id']}", {"name": "renamed", "version": 1}, format="json")
    assert stale.status_code == 409
    renamed = box.api.patch(f"/api/schedules/{created['id']}", {"name": "renamed", "version": 2}, format="json").json()
    assert renamed["source"] == "schedule:renamed"
    fire_due(at(renamed["nextRunAt"]))
    assert Task.objects.filter(source="schedule:renamed").count() == 1


def test_delete_removes_the_schedule_and_keeps_its_tasks(box: Box) -> None:
    created = make_schedule(box, name="short-lived", intervalSeconds=3600)
    fire_due(at(created["nextRunAt"]))
    assert box.api.delete(f"/api/schedules/{created['id']}").status_code == 204
    assert box.api.get(f"/api/schedules/{created['id']}").status_code == 404
    assert Task.objects.filter(source="schedule:short-lived").count() == 1


def test_another_owners_schedule_is_not_found(box: Box) -> None:
    other = make_owner()
    mine = make_schedule(box, name="mine", intervalSeconds=3600)
    theirs = Schedule.objects.create(owner=other, name="theirs", interval_seconds=3600,
                                     template={"title": "t", "prompt": "p"})
    assert box.api.get(f"/api/schedules/{theirs.pk}").status_code == 404
    assert box.api.post(f"/api/schedules/{theirs.pk}/pause").status_code == 404
    assert [s["id"] for s in box.api.get("/api/schedules").json()["results"]] == [mine["id"]]


def _build_mixed(box: Box) -> list[int]:
    """Eleven schedules: some paused (next NULL), some fired (last set), ties in next_run_at."""
    ids = []
    now = timezone.now()
    for i in range(11):
        s = make_schedule(box, name=f"s{i:02d}", intervalSeconds=3600)
        ids.append(s["id"])
    for i, pk in enumerate(ids):
        fields: dict[str, Any] = {"next_run_at": now + timedelta(minutes=i % 4)}  # ties
        if i % 3 == 0:
            fields.update(paused=True, next_run_at=None)
        if i % 2 == 0:
            fields["last_run_at"] = now - timedelta(minutes=i % 5)
        Schedule.objects.filter(pk=pk).update(**fields)
    return ids


def _walk(box: Box, sort: str, limit: int, **filters: Any) -> list[int]:
    seen, cursor = [], None
    for _ in range(50):
        params = {"sort": sort, "limit": limit, **filters}
        if cursor:
            params["cursor"] = cursor
        body = box.api.get("/api/schedules", params).json()
        seen += [s["id"] for s in body["results"]]
        cursor = body["next"]
        if not cursor:
            return seen
    raise AssertionError("the cursor never ended")


@pytest.mark.parametrize("sort", ["next", "-next", "last", "-last", "name", "-created"])
@pytest.mark.parametrize("limit", [1, 2, 4])
def test_paging_visits_every_schedule_once_in_order_with_nulls_last(box: Box, sort: str, limit: int) -> None:
    _build_mixed(box)
    field = {"next": "next_run_at", "last": "last_run_at", "name": "name", "created": "created_at"}[sort.lstrip("-")]
    rows = list(Schedule.objects.values("pk", field))
    desc = sort.startswith("-")
    with_value = sorted((r for r in rows if r[field] is not None), key=lambda r: (r[field], r["pk"]), reverse=desc)
    nulls = sorted((r["pk"] for r in rows if r[field] is None), reverse=desc)
    assert _walk(box, sort, limit) == [r["pk"] for r in with_value] + nulls


def test_a_cursor_made_for_one_sort_is_refused_for_another(box: Box) -> None:
    _build_mixed(box)
    cursor = box.api.get("/api/schedules", {"sort": "next", "limit": 2}).json()["next"]
    response = box.api.get("/api/schedules", {"sort": "-last", "limit": 2, "cursor": cursor})
    assert response.status_code == 400 and response.json()["field"] == "cursor"


def test_the_list_filters_by_status_origin_and_enabled(box: Box) -> None:
    ids = _build_mixed(box)
    Schedule.objects.filter(pk=ids[1]).update(enabled=False, disabled_reason="broken", next_run_at=None)
    system = services.ensure_system_schedule(box.owner, "builtin", interval_seconds=3600,
                                             template={"title": "t", "prompt": "p"})

    def listed(**params: Any) -> set[int]:
        response = box.api.get("/api/schedules", {"limit": 200, **params})
        assert response.status_code == 200, response.json()
        return {s["id"] for s in response.json()["results"]}

    paused = {pk for i, pk in enumerate(ids) if i % 3 == 0}
    assert listed(status="paused") == paused
    assert listed(status="disabled") == {ids[1]} == listed(enabled="false")
    assert listed(status="active") == set(ids) - paused - {ids[1]} | {system.pk}
    assert listed(status="paused,disabled") == paused | {ids[1]}
    assert listed(origin="system") == {system.pk}
    assert listed(origin="owner", enabled="true") == set(ids) - {ids[1]}
    bad = box.api.get("/api/schedules", {"status": "sleeping"})
    assert bad.status_code == 400 and bad.json()["field"] == "status"

"""The task API from a caller's side: authentication, listing, the log, errors."""
from __future__ import annotations

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from boxsite.core.auth import device_for, token_for
from boxsite.core.errors import NotFound
from boxsite.core.principal import Principal, Via
from boxsite.models import ApiToken, Device, hash_key
from tasks import services
from tasks.events import record_event
from tasks.models import Task
from tests.factories import flow, make_owner

WRITE = flow({"write": {"path": "a.txt", "content": "a"}})


def test_every_endpoint_requires_authentication(box):
    task = box.create(title="t", flow=WRITE)
    anonymous = APIClient()
    for method, url in [("get", "/api/tasks"), ("post", "/api/tasks"), ("get", f"/api/tasks/{task['id']}"),
                        ("get", f"/api/tasks/{task['id']}/events"), ("post", f"/api/tasks/{task['id']}/cancel"),
                        ("post", f"/api/tasks/{task['id']}/undo")]:
        response = getattr(anonymous, method)(url)
        assert response.status_code == 401, (method, url)
        assert response.json()["code"] == "UNAUTHENTICATED"


def test_a_revoked_or_unknown_token_is_refused(box):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer box_not-a-real-token")
    assert client.get("/api/tasks").status_code == 401
    assert box.api.get("/api/tasks").status_code == 200
    ApiToken.objects.filter(user=box.owner).update(revoked_at=timezone.now())
    assert box.api.get("/api/tasks").status_code == 401


def test_a_token_of_an_inactive_owner_is_refused(box):
    type(box.owner).objects.filter(pk=box.owner.pk).update(is_active=False)
    assert box.api.get("/api/tasks").status_code == 401


def test_a_token_and_a_device_are_read_with_their_user_as_the_orm_reads_them(box):
    box.api.get("/api/tasks")  # the token's last use written
    device = Device.objects.create(user=box.owner, name="phone", key_hash=hash_key("raw-device-key"),
                                   last_seen_at=timezone.now())
    for read, expected in ((token_for(box.token), ApiToken.objects.select_related("user").get(key_hash=hash_key(box.token))),
                           (device_for("raw-device-key"), Device.objects.select_related("user").get(pk=device.pk))):
        assert read is not None
        assert expected.last_used_at if isinstance(expected, ApiToken) else expected.last_seen_at
        for model_read, model_expected in ((read, expected), (read.user, expected.user)):
            fields = type(model_expected)._meta.concrete_fields
            assert [getattr(model_read, f.attname) for f in fields] == [getattr(model_expected, f.attname) for f in fields]
            assert not model_read._state.adding


def test_a_session_needs_the_csrf_token_for_changes(box):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(box.owner)
    assert client.get("/api/tasks").status_code == 200
    response = client.post("/api/tasks", {"title": "t", "flow": WRITE}, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "FORBIDDEN"


def test_another_owner_never_sees_my_tasks(box):
    task = box.create(title="mine", flow=WRITE)
    other = APIClient()
    other.force_login(make_owner())
    assert other.get(f"/api/tasks/{task['id']}").status_code == 404
    assert other.get("/api/tasks").json()["results"] == []
    assert other.post(f"/api/tasks/{task['id']}/cancel").status_code == 404


def test_the_owner_reads_a_task_as_the_orm_reads_it(box):
    task_id = box.create(title="read", flow=WRITE, facts={"city": "Lyon"})["id"]
    Task.objects.filter(pk=task_id).update(error="e", recoverable=True, spent={"actions": 3})
    principal = Principal(box.owner, Via.TOKEN, token=ApiToken.objects.get(key_hash=hash_key(box.token)))
    read = services.get_task_for(principal, task_id)
    expected = Task.objects.get(pk=task_id)
    fields = Task._meta.concrete_fields
    assert [getattr(read, f.attname) for f in fields] == [getattr(expected, f.attname) for f in fields]
    assert not read._state.adding
    other = Principal.session(make_owner("someone-else"))
    with pytest.raises(NotFound):
        services.get_task_for(other, task_id)


def test_the_id_has_the_documented_format(box):
    task = box.create(title="t", flow=WRITE)
    assert task["id"].startswith("tk")
    assert all(c in "0123456789abcdefghijklmnopqrstuvwxyz" for c in task["id"])
    assert task["user"] == f"box-{task['id']}"


def test_listing_pages_with_a_cursor_that_binds_its_sort(box):
    ids = [box.create(title=f"t{i}", flow=WRITE)["id"] for i in range(5)]
    first = box.api.get("/api/tasks", {"limit": 2}).json()
    second = box.api.get("/api/tasks", {"limit": 2, "cursor": first["next"]}).json()
    third = box.api.get("/api/tasks", {"limit": 2, "cursor": second["next"]}).json()
    seen = [t["id"] for page in (first, second, third) for t in page["results"]]
    assert seen == list(reversed(ids))
    assert third["next"] is None
    oldest_first = box.api.get("/api/tasks", {"sort": "created", "limit": 5}).json()
    assert [t["id"] for t in oldest_first["results"]] == ids
    reused = box.api.get("/api/tasks", {"sort": "created", "cursor": first["next"]})
    assert reused.status_code == 400 and reused.json()["field"] == "cursor"
    garbage = box.api.get("/api/tasks", {"cursor": "not-a-cursor"})
    assert garbage.status_code == 400 and garbage.json()["code"] == "INVALID_REQUEST"


def test_listing_filters_by_state_and_source(box):
    done = box.create(title="done", flow=WRITE)
    box.wait_state(done["id"], "done")
    box.create(title="labelled", flow=WRITE, source="jira:BOX-12")
    waiting = box.create(title="plain language", prompt="summarise the news")
    box.wait_state(waiting["id"], "waiting")
    states = box.api.get("/api/tasks", {"state": "waiting"}).json()["results"]
    assert [t["id"] for t in states] == [waiting["id"]]
    by_source = box.api.get("/api/tasks", {"source": "jira:BOX-12"}).json()["results"]
    assert [t["title"] for t in by_source] == ["labelled"]
    bad = box.api.get("/api/tasks", {"state": "sleeping"})
    assert bad.status_code == 400 and bad.json()["field"] == "state"


def test_the_log_reads_after_a_seq(box):
    task = box.create(title="steps", flow=flow({"run": "echo one"}, {"run": "echo two"}, {"run": "echo three"}))
    box.wait_state(task["id"], "done")
    events = box.events(task["id"])
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    steps = [e["summary"] for e in events if e["kind"] == "step"]
    assert ["one" in steps[0], "two" in steps[1], "three" in steps[2]] == [True, True, True]
    later = box.events(task["id"], after=events[2]["seq"])
    assert [e["seq"] for e in later] == [e["seq"] for e in events[3:]]
    assert box.api.get(f"/api/tasks/{task['id']}/events", {"after": "x"}).status_code == 400


def test_the_task_view_carries_next_approvals_and_a_page_of_the_log(box):
    task = box.create(title="t", flow=WRITE)
    view = box.wait_state(task["id"], "done")
    assert "undo" in view["next"] and "cancel" not in view["next"]
    detail = box.task(task["id"])
    assert detail["approvals"] == []
    assert detail["log"]["events"][0]["kind"] == "status"
    assert detail["lastSeq"] == detail["log"]["events"][-1]["seq"]


def test_cancel_then_undo(box):
    task = box.create(title="slow", flow=flow({"run": "true"}))
    box.wait_state(task["id"], "done")
    undone = box.api.post(f"/api/tasks/{task['id']}/undo").json()
    assert undone["state"] == "undone" and undone["next"] == ["diff", "report", "rerun"]
    again = box.api.post(f"/api/tasks/{task['id']}/undo")
    assert again.status_code == 409


def test_a_plain_language_task_waits_for_a_plan_instead_of_vanishing(box):
    task = box.create(title="news", prompt="summarise today's news")
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "plan"
    assert "no model is configured" in view["pause"]["message"]
    assert "cancel" in view["next"]


def test_unknown_task_is_404_in_the_error_shape(box):
    response = box.api.get("/api/tasks/tknope")
    assert response.status_code == 404
    assert response.json() == {"code": "NOT_FOUND", "message": "no task 'tknope'", "field": None}


def test_health_and_schema_are_served(box):
    health = APIClient().get("/api/health")
    assert health.status_code == 200 and health.json()["ok"] is True
    assert "isolation" in health.json()
    schema = box.api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/tasks" in schema.content
    docs = box.api.get("/api/docs/")
    assert docs.status_code == 200
    page = docs.content.decode()
    assert "swagger-ui" in page and "cdn" not in page.lower() and "https://" not in page  # served by the box


def test_the_task_view_and_its_log_page_are_one_snapshot(box):
    """A client that follows live from ``lastSeq`` must not have seen events newer than the
    state it shows: the log page stops at the view's lastSeq."""

    task = box.create(title="t", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    box.wait_state(task["id"], "done")
    row = Task.objects.get(pk=task["id"])

    with transaction.atomic():
        record_event(row, "note", "written after the view was read")
    # Simulate the race: the view says lastSeq N, and an event N+1 exists by the time the log is read.
    Task.objects.filter(pk=row.pk).update(event_seq=row.event_seq - 1)
    detail = box.task(task["id"])
    assert detail["log"]["events"][-1]["seq"] == detail["lastSeq"]
    assert all(e["seq"] <= detail["lastSeq"] for e in detail["log"]["events"])

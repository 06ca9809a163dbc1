"""The API's contract to the letter: what the docs say is what a caller gets, and a field the box
would store and ignore is refused until it works."""
from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from boxsite.models import BoxSettings
from tasks.models import Task
from tasks.spec.limits import DEFAULT_LIMITS
from tasks.spec.task import SPEC_FIELDS, LimitsBody
from tests.conftest import Box
from tests.factories import flow
from tests.pauses.helpers import cont, pending_approval, post

WRITE = flow({"write": {"path": "a.txt", "content": "a"}})


def refused(box: Box, **spec: Any) -> dict[str, Any]:
    response = box.api.post("/api/tasks", {"title": "t", "flow": WRITE, **spec})
    assert response.status_code == 400, response.json()
    return response.json()


@pytest.mark.parametrize(("spec", "field"), [
    ({"constraints": {"surfaces": ["browser"]}}, "constraints.surfaces"),
    ({"constraints": {"browser_endpoint": "http://127.0.0.1:9222"}}, "constraints.browser_endpoint"),
])
def test_a_field_that_does_nothing_yet_is_refused_naming_it(box: Box, spec: dict[str, Any], field: str) -> None:
    body = refused(box, **spec)
    assert body["code"] == "NOT_AVAILABLE" and body["field"] == field
    assert "not available yet" in body["message"]
    assert not Task.objects.exists()


def test_the_task_view_shows_the_limits_in_force(box: Box) -> None:
    default = box.create(title="t", flow=WRITE)
    assert default["limits"] == {"max_actions": 120, "max_model_calls": 6000, "max_rescues": 5, "max_elapsed_ms": None, "memory_mb": 2048,
                                 "cpu_percent": 100, "disk_mb": 10240}
    own = box.create(title="t", flow=WRITE, limits={"max_elapsed_ms": 5000, "memory_mb": 512, "cpu_percent": 50, "max_model_calls": 9})
    assert own["limits"] == {"max_actions": 120, "max_model_calls": 9, "max_rescues": 5, "max_elapsed_ms": 5000, "memory_mb": 512, "cpu_percent": 50,
                             "disk_mb": 10240}


@pytest.mark.parametrize("host", ["example.com:65536", "example.com:0", "example.com:99999"])
def test_a_host_with_a_port_out_of_range_is_refused(box: Box, host: str) -> None:
    assert refused(box, hosts=[host])["field"] == "hosts"


def test_a_host_with_a_real_port_is_taken(box: Box) -> None:
    assert box.create(title="t", flow=WRITE, hosts=["example.com:8443"])["hosts"] == ["example.com:8443"]


def test_hosts_differing_only_in_case_are_one_host(box: Box) -> None:
    task = box.create(title="t", flow=WRITE, hosts=["Example.com", "example.COM", "api.example.com"])
    assert task["hosts"] == ["example.com", "api.example.com"]


def test_a_flow_given_to_another_worker_is_refused_not_ignored(box: Box) -> None:
    body = refused(box, worker="agent", prompt="p")
    assert body["field"] == "flow" and "only for the flow worker" in body["message"]


def test_deny_after_approve_is_the_documented_conflict(box: Box) -> None:
    task = box.create(title="guarded", flow=flow({"run": "true", "stop_before": "really"}, {"run": "true"}))
    box.wait_state(task["id"], "waiting")
    approval = pending_approval(box, task["id"])
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    box.wait_state(task["id"], "done")
    response = post(box, f"/api/approvals/{approval['id']}/deny")
    assert response.status_code == 409
    assert response.json()["code"] == "CONFLICT" and "already approved" in response.json()["message"]


def test_a_payment_checkpoint_offers_the_undo_it_allows(box: Box) -> None:
    pay = flow({"write": {"path": "form.txt", "content": "filled"}}, {"checkpoint": {"reason": "pay", "payment": True}})
    task = box.create(title="buy", flow=pay)
    view = box.wait_state(task["id"], "waiting")
    assert view["final"] is True and "undo" in view["next"]
    assert cont(box, task["id"], approve=True).status_code == 409
    assert post(box, f"/api/tasks/{task['id']}/undo").status_code == 200
    assert box.task(task["id"])["state"] == "undone"


def test_keep_on_a_workspace_task_says_so_whatever_the_token(box: Box) -> None:
    task = box.create(title="t", flow=WRITE)
    box.wait_state(task["id"], "done")
    _, raw = issue_api_token(box.owner, "no folders", can_use_folders=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post(f"/api/tasks/{task['id']}/keep")
    assert response.status_code == 409 and response.json()["field"] == "review"
    assert "only folder tasks" in response.json()["message"]


def test_at_capacity_a_create_is_refused_before_the_spec_is_read(box: Box, django_assert_max_num_queries: Any) -> None:
    BoxSettings.objects.update_or_create(pk=1, defaults={"max_active_tasks": 1})
    waiting = box.create(title="guarded", flow=flow({"run": "true", "stop_before": "really"}))
    box.wait_state(waiting["id"], "waiting")
    with django_assert_max_num_queries(6):  # who is asking, the settings, one count: no spec checks
        response = box.api.post("/api/tasks", {"title": "t", "workspace": "nowhere", "flow": WRITE})
    assert response.status_code == 429 and response.json()["code"] == "TOO_MANY_TASKS"
    assert Task.objects.count() == 1


@pytest.mark.parametrize(("url", "body"), [
    ("/api/tokens", {"name": "ci", "expires": "never"}),
    ("/api/pairing/claim", {"code": "123456", "trusted": True}),
    ("/api/vault", {"name": "K", "value": "v", "note": "x"}),
    ("/api/settings", {"theme": "dark"}),
])
def test_a_field_an_endpoint_does_not_take_is_refused_naming_it(box: Box, url: str, body: dict[str, Any]) -> None:
    method = box.api.patch if url == "/api/settings" else box.api.post
    response = method(url, body)
    assert response.status_code == 400, response.json()
    unknown = next(k for k in body if k not in ("name", "value", "code"))
    assert response.json()["field"] == unknown and "unknown field" in response.json()["message"]


def test_the_spec_takes_exactly_the_fields_its_schema_declares(box: Box) -> None:
    document = box.api.get("/api/schema/").json()
    declared = set(document["components"]["schemas"]["TaskSpecBodyRequest"]["properties"])
    assert declared == set(SPEC_FIELDS)
    assert refused(box, colour="red")["field"] == "colour"


def test_every_limit_the_spec_declares_has_a_default_and_every_default_is_declared() -> None:
    assert set(LimitsBody.names()) == set(DEFAULT_LIMITS)

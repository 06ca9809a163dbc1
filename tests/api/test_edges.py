"""Hostile and odd inputs at the API's edge: every one gets an answer in the error shape, never
a 500 or an HTML page, on SQLite and PostgreSQL alike."""
from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from boxsite.core.principal import Principal
from schedules.signatures import github_header
from tests.conftest import Box
from tests.factories import flow

WRITE = flow({"write": {"path": "a.txt", "content": "a"}})


def assert_error(response: Any, status: int, code: str, field: str | None = "-") -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    if field != "-":
        assert body["field"] == field, body
    return body


def test_an_unbalanced_quote_in_command_names_the_field(box: Box) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "prompt": "p", "worker": "command", "command": "echo 'oops"})
    assert_error(response, 400, "INVALID_SPEC", "command")


@pytest.mark.parametrize(("field", "value"), [("budgetCents", 2**31), ("externalAttempt", 2**40),
                                              ("budgetCents", 10**30)])
def test_a_number_beyond_its_column_is_refused(box: Box, field: str, value: int) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": WRITE, field: value})
    body = assert_error(response, 400, "INVALID_SPEC", field)
    assert "at most" in body["message"]


def test_a_limit_beyond_range_is_refused(box: Box) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": WRITE, "limits": {"max_actions": 2**63}})
    assert_error(response, 400, "INVALID_SPEC", "limits.max_actions")


def test_a_nul_character_in_a_body_names_where_it_is(box: Box) -> None:
    assert_error(box.api.post("/api/tasks", {"title": "a\x00b", "flow": WRITE}), 400, "INVALID_REQUEST", "title")
    nested = {"title": "t", "flow": WRITE, "facts": {"name": "x\x00"}}
    assert_error(box.api.post("/api/tasks", nested), 400, "INVALID_REQUEST", "facts.name")
    assert_error(box.api.post("/api/schedules", {"name": "n\x00", "intervalSeconds": 60}), 400, "INVALID_REQUEST", "name")
    assert_error(box.api.patch("/api/settings", {"defaultHosts": ["a\x00.com"]}), 400, "INVALID_REQUEST", "defaultHosts.0")


def test_a_nul_character_in_a_path_or_query_is_refused(box: Box) -> None:
    assert_error(box.api.get("/api/tasks/tk%00x"), 400, "INVALID_REQUEST", "path")
    assert_error(box.api.get("/api/tasks", {"state": "done\x00"}), 400, "INVALID_REQUEST", "state")
    assert_error(box.api.get("/api/tasks?source=%00"), 400, "INVALID_REQUEST", "source")
    assert_error(box.api.get("/api/workspaces/home/files", {"path": "a\x00b"}), 400, "INVALID_REQUEST", "path")
    assert_error(box.api.delete("/api/vault/a%00b"), 400, "INVALID_REQUEST", "path")


def test_a_webhook_payload_with_a_nul_is_refused_not_a_crash(box: Box) -> None:
    hook = box.api.post("/api/triggers", {"name": "gh", "kind": "webhook",
                                          "template": {"title": "t", "prompt": "p"}}).json()
    body = json.dumps({"action": "op\u0000ened"}).encode()
    assert b"\\u0000" in body
    response = Client().post(hook["path"], data=body, content_type="application/json",
                             HTTP_X_HUB_SIGNATURE_256=github_header(hook["secret"], body), HTTP_X_GITHUB_DELIVERY="d1")
    assert_error(response, 400, "INVALID_REQUEST", "body")


def _forged(payload: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


@pytest.mark.parametrize(("url", "sort"), [("/api/tasks", "-created"), ("/api/schedules", "next"),
                                           ("/api/triggers", "-created")])
@pytest.mark.parametrize("value", ["not a date", 2**70, None, {"a": 1}])
def test_a_forged_well_formed_cursor_is_refused(box: Box, url: str, sort: str, value: Any) -> None:
    cursor = _forged({"sort": sort, "v": value, "pk": "x' OR 1=1" if value is None else 2**70})
    assert_error(box.api.get(url, {"sort": sort, "cursor": cursor}), 400, "INVALID_REQUEST", "cursor")


def test_a_real_cursor_still_pages(box: Box) -> None:
    for i in range(3):
        box.api.post("/api/schedules", {"name": f"s{i}", "intervalSeconds": 60,
                                        "template": {"title": "t", "prompt": "p"}})
    first = box.api.get("/api/schedules", {"limit": 2, "sort": "name"}).json()
    second = box.api.get("/api/schedules", {"limit": 2, "sort": "name", "cursor": first["next"]}).json()
    assert [s["name"] for s in first["results"] + second["results"]] == ["s0", "s1", "s2"]


@pytest.mark.parametrize("depth", [100, 5000, 100_000])
def test_json_nested_thousands_deep_is_refused(box: Box, depth: int) -> None:
    body = '{"title": "t", "facts": ' + "[" * depth + "]" * depth + "}"
    response = box.api.post("/api/tasks", body, content_type="application/json")
    assert_error(response, 400, "INVALID_REQUEST")
    assert "nested" in response.json()["message"]


def test_a_body_over_the_limit_is_413_in_the_error_shape(box: Box, settings: Any) -> None:
    settings.BOX_API_MAX_BYTES = 4096
    big = {"title": "t", "prompt": "x" * 5000}
    assert_error(box.api.post("/api/tasks", big), 413, "PAYLOAD_TOO_LARGE", "body")
    anonymous = APIClient()
    assert_error(anonymous.post("/api/pairing/claim", big), 413, "PAYLOAD_TOO_LARGE", "body")


def test_another_media_type_is_415_with_its_own_code(box: Box) -> None:
    response = box.api.post("/api/tasks", "title=t", content_type="application/x-www-form-urlencoded")
    assert_error(response, 415, "UNSUPPORTED_MEDIA_TYPE")


@pytest.mark.parametrize("path", ["/api/nope", "/api/tasks/tk1/nope", "/api/", "/api", "/hooks/"])
def test_an_unknown_api_path_is_a_json_404(box: Box, path: str) -> None:
    body = assert_error(box.api.get(path), 404, "NOT_FOUND")
    assert path in body["message"]


def test_an_unknown_page_is_still_a_page(box: Box) -> None:
    response = Client().get("/no-such-page")
    assert response.status_code == 404 and not response["Content-Type"].startswith("application/json")


def test_an_unexpected_error_answers_the_error_shape_with_a_reference_in_the_log(
        box: Box, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    task = box.create(title="t", flow=WRITE)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug the box did not foresee")

    monkeypatch.setattr(Principal, "of", classmethod(broken))  # every view starts here
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {box.token}")
    with caplog.at_level(logging.ERROR):
        response = client.get(f"/api/tasks/{task['id']}/report")
    body = assert_error(response, 500, "SERVER_ERROR", None)
    reference = body["reference"]
    assert reference in body["message"]
    logged = [r for r in caplog.records if reference in r.getMessage()]
    assert logged and logged[0].exc_info and "a bug the box did not foresee" in str(logged[0].exc_info[1])
    assert "a bug the box did not foresee" not in json.dumps(body)  # the details stay in the log


def test_the_bearer_scheme_is_case_insensitive_and_blank_is_unauthenticated(box: Box) -> None:
    lower = APIClient()
    lower.credentials(HTTP_AUTHORIZATION=f"bearer {box.token}")
    assert lower.get("/api/tasks").status_code == 200
    blank = APIClient()
    blank.credentials(HTTP_AUTHORIZATION="   ")
    assert_error(blank.get("/api/tasks"), 401, "UNAUTHENTICATED")

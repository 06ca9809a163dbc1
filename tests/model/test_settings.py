"""Settings → Model: one place for the endpoint, the key (a vault secret) and prices, and a
Test connection that says what the endpoint answered."""
from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from boxsite.core.auth import DEVICE_COOKIE
from tests.fakemodel import Answer, FakeModel, call, say
from tests.model.conftest import KEY
from tests.portal.conftest import pair_device


def test_the_model_is_configured_in_one_place_and_the_key_is_never_shown(box: Any, fake_model: FakeModel) -> None:
    before = box.api.get("/api/settings/model").json()
    assert before["configured"] is False
    response = box.api.patch("/api/settings/model", {"baseUrl": fake_model.base_url, "model": "m1", "key": KEY,
                                                     "inputCentsPerMillion": 300}, format="json")
    assert response.status_code == 200, response.json()
    shown = response.json()
    assert shown["configured"] is True and shown["model"] == "m1" and shown["keySet"] is True
    assert shown["inputCentsPerMillion"] == 300 and shown["keyName"] == "MODEL_API_KEY"
    assert KEY not in response.content.decode()
    names = [s["name"] for s in box.api.get("/api/vault").json()["secrets"]]
    assert "MODEL_API_KEY" in names


def test_bad_model_settings_are_refused_naming_the_field(box: Any) -> None:
    for body, field in (({"baseUrl": "ftp://x"}, "baseUrl"), ({"inputCentsPerMillion": -1}, "inputCentsPerMillion"),
                        ({"keyName": "not a name"}, "name"), ({"temperature": 1}, "temperature"),
                        ({"contextTokens": 100}, "contextTokens"), ({"contextTokens": "big"}, "contextTokens")):
        response = box.api.patch("/api/settings/model", body, format="json")
        assert response.status_code == 400, body
        assert response.json()["field"] == field, response.json()


def test_test_connection_reports_what_the_endpoint_answered(box: Any, model: FakeModel) -> None:
    model.answer(say("ready"), call("report_ready", word="ready"), say('{"ready": true}'))
    result = box.api.post("/api/settings/model/test").json()
    assert result["ok"] is True and result["answer"] == "ready", result
    assert [(c["name"], c["ok"]) for c in result["checks"]] == [("answer", True), ("tools", True), ("json", True),
                                                                   ("context", True)]
    assert model.received[-1].headers.get("authorization") == f"Bearer {KEY}"

    model.answer(Answer(status=401, error="invalid api key"))
    result = box.api.post("/api/settings/model/test").json()
    assert result["ok"] is False and result["kind"] == "status"
    assert result["error"] == "the model's endpoint answered HTTP 401: invalid api key"
    assert result["checks"] == [{"name": "answer", "ok": False, "reason": result["error"]}]

    model.answer(Answer(raw=b"<html>not an API</html>"))
    result = box.api.post("/api/settings/model/test").json()
    assert result["ok"] is False and result["kind"] == "garbage"


def test_test_connection_without_a_model_says_what_to_configure(box: Any) -> None:
    result = box.api.post("/api/settings/model/test").json()
    assert result["ok"] is False and result["kind"] == "config" and "Settings → Model" in result["error"]


def test_a_paired_phone_cannot_see_or_change_the_model(box: Any) -> None:
    phone = APIClient()
    phone.cookies[DEVICE_COOKIE] = pair_device(box.api)
    assert phone.get("/api/settings/model").status_code == 403
    assert phone.patch("/api/settings/model", {"model": "x"}, format="json").status_code == 403
    assert phone.post("/api/settings/model/test").status_code == 403
    assert phone.get("/api/describe").status_code == 200  # the guide is for any caller


def test_test_connection_says_plainly_what_the_model_cannot_do(box: Any, model: FakeModel) -> None:
    model.context_tokens = 4096
    assert box.api.patch("/api/settings/model", {"contextTokens": 4096}, format="json").status_code == 200
    model.answer(say("ready"), Answer(status=400, error="fake-model does not support tools"), say("sure, here you go: ready"))
    result = box.api.post("/api/settings/model/test").json()
    assert result["ok"] is False and result["kind"] == "capability" and result["contextTokens"] == 4096
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["answer"]["ok"] is True
    assert checks["tools"]["ok"] is False and checks["tools"]["reason"].startswith("does not support tools")
    assert checks["json"]["ok"] is False and checks["json"]["reason"].startswith("does not answer in JSON")
    assert checks["context"] == {"name": "context", "ok": False, "reason": checks["context"]["reason"]}
    assert checks["context"]["reason"].startswith("context 4096: too small for agent tasks")
    assert "does not support tools" in result["error"] and "context 4096" in result["error"]


def test_test_connection_notices_a_model_answering_in_text_instead_of_calling_the_tool(box: Any, model: FakeModel) -> None:
    model.answer(say("ready"), say("report_ready(word='ready')"), say('{"ready": true}'))
    result = box.api.post("/api/settings/model/test").json()
    checks = {c["name"]: c["ok"] for c in result["checks"]}
    assert checks == {"answer": True, "tools": False, "json": True, "context": True}
    assert "does not support tools" in result["error"]


def test_test_connection_says_a_model_writing_tool_calls_as_text_is_read_by_the_agent(box: Any, model: FakeModel) -> None:
    text = '<think>use the tool</think><tool_call>\n{"name": "report_ready", "arguments": {"word": "ready"}}\n</tool_call>'
    model.answer(say("ready"), say(text), say('{"ready": true}'))
    result = box.api.post("/api/settings/model/test").json()
    assert result["ok"] is True, result
    tools = next(c for c in result["checks"] if c["name"] == "tools")
    assert tools["ok"] is True and tools["reason"].startswith("writes its tool calls as text")
    assert "does not support tools" not in tools["reason"]

"""A model whose vault key is missing does not fail the task: one question asks for the key, the
answer goes straight into the vault, and the task goes on. Nothing is sent or spent meanwhile."""
from __future__ import annotations

from typing import Any

from tests.fakemodel import FakeModel, call, secret_forms
from tests.pauses.helpers import cont, open_questions


def test_a_missing_model_key_asks_for_it_and_resumes_when_answered(box: Any, fake_model: FakeModel) -> None:
    box.api.patch("/api/settings/model", {"baseUrl": fake_model.hosted_url, "model": "m", "keyName": "LLM_KEY",
                                          "inputCentsPerMillion": 100}, format="json")
    task = box.create(title="x", prompt="do it", budgetCents=100)
    waiting = box.wait_state(task["id"], "waiting")
    assert waiting["waitingFor"] == "input" and waiting["costCents"] == 0
    assert fake_model.received == [] and waiting["spent"].get("model_calls", 0) == 0
    [question] = open_questions(box, task["id"])
    assert question["fields"][0]["name"] == "LLM_KEY" and question["fields"][0]["kind"] == "vault"

    fake_model.answer(call("finish", answer="done it"))
    key = "sk-answered-in-the-inbox-42"
    assert cont(box, task["id"], inputs={"LLM_KEY": key}).status_code == 200
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert fake_model.received[0].headers["authorization"] == f"Bearer {key}"
    assert "LLM_KEY" not in done["facts"]
    shown = box.api.get(f"/api/tasks/{task['id']}/report").content.decode() + str(box.events(task["id"]))
    for form in secret_forms(key):
        assert form not in shown
    assert box.api.get("/api/settings/model").json()["keySet"] is True


def test_a_local_model_without_a_key_is_asked_for_none(box: Any, fake_model: FakeModel) -> None:
    settings = box.api.patch("/api/settings/model", {"baseUrl": fake_model.base_url, "model": "m", "keyName": "LLM_KEY"},
                             format="json").json()
    assert settings["keyNeeded"] is False and settings["keySet"] is False
    fake_model.answer(call("finish", answer="done locally"))
    task = box.create(title="x", prompt="do it", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed", "waiting")
    assert done["state"] == "done", done
    assert open_questions(box, task["id"]) == []
    assert fake_model.received[0].headers["authorization"] == "Bearer none"


def test_a_local_model_with_a_key_set_is_sent_it(box: Any, fake_model: FakeModel) -> None:
    box.api.patch("/api/settings/model", {"baseUrl": fake_model.base_url, "model": "m", "keyName": "LLM_KEY",
                                          "key": "sk-local-proxy-key-9"}, format="json")
    fake_model.answer(call("finish", answer="done"))
    task = box.create(title="x", prompt="do it", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed", "waiting")["state"] == "done"
    assert fake_model.received[0].headers["authorization"] == "Bearer sk-local-proxy-key-9"

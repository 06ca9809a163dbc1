"""A model whose vault key is missing does not fail the task: one question asks for the key, the
answer goes straight into the vault, and the task goes on. Nothing is sent or spent meanwhile."""
from __future__ import annotations

from typing import Any

from tests.fakemodel import FakeModel, call, secret_forms
from tests.pauses.helpers import cont, open_questions


def test_a_missing_model_key_asks_for_it_and_resumes_when_answered(box: Any, fake_model: FakeModel) -> None:
    box.api.patch("/api/settings/model", {"baseUrl": fake_model.base_url, "model": "m", "keyName": "LLM_KEY",
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

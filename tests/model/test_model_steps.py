"""`model` flow steps: one model call, with an optional JSON Schema for its answer, saved under `save`."""
from __future__ import annotations

import json
from typing import Any

from tests.fakemodel import FakeModel, say, secret_forms
from tests.pauses.helpers import pending_approval, post, report

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
          "required": ["city", "days"]}


def test_a_model_step_answers_to_its_schema_and_the_answer_is_saved(box: Any, model: FakeModel) -> None:
    model.answer(say('{"city": "Pune", "days": 3}'))
    flow = {"steps": [{"model": {"prompt": "Plan a trip for ${who}", "schema": SCHEMA}, "save": "trip"},
                      {"write": {"path": "trip.txt", "content": "${trip}"}}]}
    task = box.create(title="trip", flow=flow, facts={"who": "Asha"}, budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert report(box, task["id"])["records"]["trip"] == {"city": "Pune", "days": 3}
    sent = model.received[0].messages
    assert sent[0]["content"] == "Plan a trip for Asha"
    assert json.loads(sent[-1]["content"].split("\n", 1)[1]) == SCHEMA  # (PostgreSQL keeps keys in its own order)
    result = [e for e in box.events(task["id"]) if e["kind"] == "step_result"][0]
    assert result["data"]["usage"] == {"inputTokens": 100, "outputTokens": 20}
    assert result["data"]["decision"]["content"] == '{"city": "Pune", "days": 3}'
    assert done["spent"]["model_calls"] == 1


def test_an_answer_outside_the_schema_is_asked_again_then_fails_the_step(box: Any, model: FakeModel) -> None:
    model.answer(say('{"city": "Pune"}'), say("```json\n{\"city\": \"Pune\", \"days\": 2}\n```"))
    task = box.create(title="ok second time", flow={"steps": [{"model": {"prompt": "p", "schema": SCHEMA}, "save": "x"}]},
                      budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert "'days' is a required property" in model.received[1].messages[-1]["content"]

    model.answer(say("not json"), say('{"days": "three"}'))
    task = box.create(title="never", flow={"steps": [{"model": {"prompt": "p", "schema": SCHEMA}, "save": "x"}]},
                      budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["state"] == "failed" and failed["recoverable"] is True
    assert "does not follow the schema" in failed["error"]


def test_a_secret_in_a_model_steps_prompt_reaches_the_model_only_as_its_name(box: Any, model: FakeModel) -> None:
    model.answer(say("fine"))
    secret = "4111 1111 1111 1111"
    task = box.create(title="s", flow={"steps": [{"model": "Is ${card_number} a test card?", "save": "a"}]},
                      facts={"card_number": secret}, budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert model.received[0].messages[0]["content"] == "Is ${card_number} a test card?"
    sent = model.everything_sent()
    for form in secret_forms(secret) + secret_forms(secret.replace(" ", "")):
        assert form not in sent


def test_a_model_step_over_budget_waits_for_approval_before_the_call(box: Any, model: FakeModel) -> None:
    model.answer(say("hi"))
    task = box.create(title="b", flow={"steps": [{"model": "say hi", "save": "a"}]}, budgetCents=0)
    assert box.wait_state(task["id"], "waiting")["waitingFor"] == "approval"
    assert model.received == []
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "spending"
    post(box, f"/api/approvals/{approval['id']}/approve")
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert len(model.received) == 1


def test_a_model_step_with_a_schema_that_is_not_one_is_refused(box: Any) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": {"steps": [{"model": {"prompt": "p", "schema": {"type": 5}}}]}},
                            format="json")
    assert response.status_code == 400 and response.json()["code"] == "INVALID_FLOW"
    assert response.json()["field"] == "flow.steps[0].model.schema"


def test_a_model_step_without_a_model_fails_saying_what_to_configure(box: Any) -> None:
    task = box.create(title="n", flow={"steps": [{"model": "hi"}]})
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["recoverable"] is True and "Settings → Model" in failed["error"]

"""Output shaping: `output: {instructions, schema}` turns what the task saved into the answer
asked for, shown beside the raw records."""
from __future__ import annotations

from typing import Any

from tests.fakemodel import FakeModel, call, say
from tests.pauses.helpers import report

SCHEMA = {"type": "object", "properties": {"cheapest": {"type": "string"}, "price": {"type": "number"}},
          "required": ["cheapest", "price"], "additionalProperties": False}
FLOW = {"steps": [{"run": "printf 'A 30\\nB 12\\n'", "save": "prices"}]}


def test_a_flow_tasks_output_is_shaped_to_its_schema(box: Any, model: FakeModel) -> None:
    model.answer(say('{"cheapest": "B", "price": 12}'))
    task = box.create(title="prices", flow=FLOW, budgetCents=100,
                      output={"instructions": "the cheapest item and its price", "schema": SCHEMA})
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert done["result"] == {"cheapest": "B", "price": 12}
    assert report(box, task["id"])["records"]["prices"] == "A 30\nB 12"  # the raw records stay
    sent = model.received[0].messages
    assert "the cheapest item and its price" in sent[1]["content"] and "A 30" in sent[1]["content"]


def test_an_agent_tasks_answer_is_shaped_too(box: Any, model: FakeModel) -> None:
    model.answer(call("finish", answer="B is cheapest at 12"), say('{"cheapest": "B", "price": 12}'))
    task = box.create(title="prices", prompt="find the cheapest", budgetCents=100,
                      output={"instructions": "the cheapest", "schema": SCHEMA})
    assert box.wait_state(task["id"], "done", "failed")["result"] == {"cheapest": "B", "price": 12}


def test_an_answer_outside_the_schema_leaves_the_task_done_saying_why(box: Any, model: FakeModel) -> None:
    model.answer(say('{"cheapest": "B"}'), say('{"cheapest": "B", "price": "twelve"}'))
    task = box.create(title="prices", flow=FLOW, budgetCents=100, output={"instructions": "x", "schema": SCHEMA})
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done" and done["result"] is None
    assert "does not follow the schema" in report(box, task["id"])["records"]["resultError"]


def test_a_schema_outside_the_supported_subset_is_invalid_output(box: Any, model: FakeModel) -> None:
    for schema, where in (({"$ref": "#/x"}, "'$ref'"), ({"type": "object", "properties": {"a": {"if": {}}}}, "'if'"),
                          ({"type": 7}, "7")):
        response = box.api.post("/api/tasks", {"title": "t", "flow": FLOW, "output": {"instructions": "x", "schema": schema}},
                                format="json")
        assert response.status_code == 400, schema
        assert response.json()["code"] == "INVALID_OUTPUT" and response.json()["field"] == "output.schema"
        assert where in response.json()["message"]


def test_output_without_a_model_is_output_unavailable(box: Any) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": FLOW, "output": {"instructions": "x"}}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "OUTPUT_UNAVAILABLE"

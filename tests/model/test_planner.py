"""The planner: a plain-language task with the flow worker is written into a flow by the model,
checked by the same validator as POST /api/tasks, shown, then run; replans are bounded and the
owner may authorise one more. Without a model the task waits for a plan, pointing to the guide."""
from __future__ import annotations

import json
from typing import Any

from tests.fakemodel import FakeModel, say
from tests.pauses.helpers import cont, open_questions, report


def flow(*steps: dict[str, Any]) -> Any:
    return say(json.dumps({"steps": list(steps)}))


def test_a_rejected_plan_is_replanned_then_shown_and_run(box: Any, model: FakeModel) -> None:
    model.answer(say(json.dumps({"steps": [{"teleport": "home"}]})),
                 flow({"write": {"path": "plan.txt", "content": "planned"}}))
    task = box.create(title="p", prompt="write plan.txt", worker="flow", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert done["flow"] == {"steps": [{"write": {"path": "plan.txt", "content": "planned"}}]}
    assert "'teleport' is not a step kind" in json.dumps(model.received[1].messages)
    notes = [e for e in box.events(task["id"]) if e["kind"] == "note" and "plan" in e["data"]]
    assert "plan 1 rejected" in notes[0]["summary"] and notes[1]["data"]["plan"] == done["flow"]
    assert report(box, task["id"])["flow"] == done["flow"]
    guide = model.received[0].messages[0]["content"]
    assert "stop_before" in guide and "examples" in guide


def test_replans_are_bounded_and_the_owner_may_allow_one_more(box: Any, model: FakeModel) -> None:
    failing = {"run": "exit 3"}
    model.answer(flow(failing), flow(failing), flow(failing), flow(failing))
    task = box.create(title="r", prompt="do the impossible", worker="flow", budgetCents=100, limits={"max_rescues": 0})
    waiting = box.wait_state(task["id"], "waiting", "failed", timeout=60)
    assert waiting["waitingFor"] == "input", waiting
    assert waiting["spent"]["replans"] == 3 and len(model.received) == 4
    [question] = open_questions(box, task["id"])
    assert question["fields"][0]["name"] == "final_replan"

    model.answer(flow({"write": {"path": "ok.txt", "content": "finally"}}))
    assert cont(box, task["id"], inputs={"final_replan": "yes"}).status_code == 200
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert done["spent"]["final_replans"] == 1
    assert "Error: exit 3" in json.dumps(model.received[-1].messages)


def test_the_owner_can_refuse_the_final_replan(box: Any, model: FakeModel) -> None:
    model.fallback = flow({"run": "exit 3"})
    task = box.create(title="r", prompt="do the impossible", worker="flow", budgetCents=100, limits={"max_rescues": 0})
    assert box.wait_state(task["id"], "waiting", "failed", timeout=60)["waitingFor"] == "input"
    cont(box, task["id"], inputs={"final_replan": "no"})
    failed = box.wait_state(task["id"], "failed", "done")
    assert "did not allow another replan" in failed["error"]


def test_without_a_model_a_planned_task_waits_and_points_to_the_guide(box: Any) -> None:
    task = box.create(title="p", prompt="tidy up", worker="flow")
    waiting = box.wait_state(task["id"], "waiting")
    assert waiting["waitingFor"] == "plan" and "GET /api/describe" in waiting["pause"]["message"]
    guide = box.api.get("/api/describe").json()
    assert set(guide["steps"]) >= {"run", "write", "model", "ask", "approve"}
    assert guide["steps"]["run"]["schema"]["required"] == ["run"]
    for example in guide["examples"]:  # every worked example is a flow the box takes
        assert box.api.post("/api/tasks", {"title": "example", "flow": example["flow"]}, format="json").status_code == 201

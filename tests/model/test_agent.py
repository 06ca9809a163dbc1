"""The agent worker: a plain-language task run by the model in a tool-calling loop, against a
real local chat-completions server."""
from __future__ import annotations

import json
from typing import Any

from tasks.tools.registry import Tool, register
from tests.fakemodel import Answer, FakeModel, call, say, secret_forms
from tests.model.conftest import KEY
from tests.pauses.helpers import cont, open_questions, pending_approval, post


def test_a_prompt_task_lists_files_writes_one_and_finishes(box: Any, model: FakeModel) -> None:
    (box.home / "notes.txt").write_text("buy milk\n")
    model.answer(call("list_files", path="."), call("read_file", path="notes.txt"),
                 call("write_file", path="todo.md", content="- buy milk\n"), call("finish", answer="wrote todo.md"))
    task = box.create(title="tidy", prompt="turn my notes into a todo list", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert (box.home / "todo.md").exists() is False  # the task's own layer, until it joins
    files = box.api.get("/api/workspaces/home/files", {"path": "todo.md"})
    assert "buy milk" in json.dumps(files.json())
    # What the model saw: the task, then each tool's result, in order.
    assert "turn my notes into a todo list" in json.dumps(model.received[0].messages)
    assert "notes.txt" in model.received[1].messages[-1]["content"]
    assert "buy milk" in model.received[2].messages[-1]["content"]
    assert len(model.received) == 4
    # Every turn is a step with its evidence: what was sent, the decision, usage and cost.
    events = box.events(task["id"])
    turns = [e for e in events if e["kind"] == "step" and e["data"].get("kind") == "model"]
    results = [e for e in events if e["kind"] == "step_result" and e["data"].get("kind") == "model"]
    assert [t["data"]["step"] for t in turns] == [1, 2, 3, 4]
    assert turns[0]["data"]["sent"][1]["content"].startswith("turn my notes")
    assert results[2]["data"]["decision"]["toolCalls"][0]["name"] == "write_file"
    assert results[0]["data"]["usage"] == {"inputTokens": 100, "outputTokens": 20}
    assert [e["data"]["tool"] for e in events if e["kind"] == "tool_result"] == ["list_files", "read_file", "write_file"]
    view = box.task(task["id"])
    assert view["spent"]["model_calls"] == 4
    # 4 calls x (100 in at 100¢/M + 20 out at 200¢/M) = 0.056¢, charged as 1¢
    assert view["costCents"] == 1
    assert box.api.get(f"/api/tasks/{task['id']}/report").json()["records"]["answer"] == "wrote todo.md"


def test_a_run_command_executes_in_the_tasks_copy(box: Any, model: FakeModel) -> None:
    model.answer(call("run_command", command="echo hello > greeting.txt && cat greeting.txt"), say("done: greeting written"))
    task = box.create(title="greet", prompt="write a greeting", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert '"hello' in model.received[1].messages[-1]["content"]
    assert done["step"] == "done: greeting written" or "greeting written" in json.dumps(box.events(task["id"])[-3:])


def test_an_irreversible_step_waits_for_the_owners_ok_then_goes_on(box: Any, model: FakeModel) -> None:
    model.answer(call("request_approval", action="delete old.log"), call("run_command", command="rm old.log"),
                 call("finish", answer="deleted"))
    (box.home / "old.log").write_text("x")
    task = box.create(title="clean", prompt="delete old.log", budgetCents=100)
    waiting = box.wait_state(task["id"], "waiting")
    assert waiting["waitingFor"] == "approval"
    approval = pending_approval(box, task["id"])
    assert approval["summary"] == "delete old.log"
    assert len(model.received) == 1  # nothing more is asked while it waits
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert "approved" in model.received[1].messages[-1]["content"]


def test_the_agent_asks_the_owner_and_goes_on_with_the_answer(box: Any, model: FakeModel) -> None:
    model.answer(call("ask_owner", name="city", question="Which city?"), call("finish", answer="ok"))
    task = box.create(title="weather", prompt="what's the weather", budgetCents=100)
    assert box.wait_state(task["id"], "waiting")["waitingFor"] == "input"
    [question] = open_questions(box, task["id"])
    assert question["fields"][0]["name"] == "city"
    assert cont(box, task["id"], inputs={"city": "Pune"}).status_code == 200
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert "Pune" in model.received[1].messages[-1]["content"]


def test_a_secret_reaches_the_model_only_as_its_name(box: Any, model: FakeModel) -> None:
    secret = "hunter2-correct-horse-battery"
    model.answer(call("run_command", command="printf '%s' '${password}' > pw.txt && cat pw.txt && echo ${password} | base64"),
                 call("read_file", path="pw.txt"), call("finish", answer="stored ${password}"))
    task = box.create(title="store", prompt="store my password in pw.txt", facts={"password": secret, "city": "Pune"},
                      budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    files = box.api.get("/api/workspaces/home/files", {"path": "pw.txt"})
    assert files.status_code == 200
    sent = model.everything_sent()
    assert "${password}" in sent and "Pune" in sent  # a shared fact is given by value
    for form in secret_forms(secret) + secret_forms(KEY):
        assert form not in sent, form
    # and not in the log either
    log = json.dumps(box.events(task["id"]))
    for form in secret_forms(secret) + secret_forms(KEY):
        assert form not in log, form


def test_a_call_that_would_cross_the_budget_waits_for_approval_before_it_is_made(box: Any, model: FakeModel) -> None:
    model.answer(call("finish", answer="ok"))
    task = box.create(title="paid", prompt="do it", budgetCents=0)
    waiting = box.wait_state(task["id"], "waiting")
    assert waiting["waitingFor"] == "approval"
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "spending" and approval["amountCents"] >= 1
    assert model.received == []
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert len(model.received) == 1 and done["costCents"] >= 1


def test_max_model_calls_fails_the_task_recoverably_naming_the_limit(box: Any, model: FakeModel) -> None:
    model.fallback = call("list_files", path=".")
    task = box.create(title="loop", prompt="look around forever", budgetCents=100, limits={"max_model_calls": 3})
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["state"] == "failed" and failed["recoverable"] is True
    assert "max_model_calls" in failed["hint"]
    assert len(model.received) == 3


def test_an_endpoint_that_errors_fails_the_task_recoverably_with_the_reason(box: Any, model: FakeModel) -> None:
    model.fallback = Answer(status=500, error="upstream exploded")  # every try
    task = box.create(title="x", prompt="do it", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["recoverable"] is True
    assert "HTTP 500: upstream exploded" in failed["error"] and "Settings → Model" in failed["hint"]


def test_an_endpoint_answering_garbage_fails_clearly(box: Any, model: FakeModel) -> None:
    model.answer(Answer(raw=b"{\"not\": \"a completion\"}"))
    task = box.create(title="x", prompt="do it", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["recoverable"] is True and "not a chat completion" in failed["error"]


def test_an_endpoint_that_is_down_fails_clearly_and_nothing_hangs(box: Any, model: FakeModel) -> None:
    model.close()
    task = box.create(title="x", prompt="do it", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done", timeout=30)
    assert failed["recoverable"] is True and "cannot be reached" in failed["error"]


def test_a_slow_endpoint_times_out(box: Any, model: FakeModel, settings: Any) -> None:
    settings.BOX_MODEL_IDLE_TIMEOUT_S = 0.5
    model.fallback = Answer(content="late", delay_s=3)  # every try
    task = box.create(title="x", prompt="do it", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done", timeout=30)
    assert "did not answer within 0.5 s" in failed["error"]


def test_without_a_model_a_prompt_task_waits_for_a_plan_saying_what_to_configure(box: Any) -> None:
    task = box.create(title="x", prompt="do it")
    waiting = box.wait_state(task["id"], "waiting")
    assert waiting["waitingFor"] == "plan" and "Settings → Model" in waiting["pause"]["message"]


def test_a_broker_tool_that_acts_irreversibly_waits_for_the_owner_then_runs(box: Any, model: FakeModel) -> None:
    calls: list[dict[str, Any]] = []

    def send(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"sent": True, "to": args["to"]}

    register(Tool(name="test.send", description="send a message", irreversible=True,
                  schema={"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}, impl=send))
    model.answer(call("tool_test__send", to="${email}"), call("finish", answer="sent"))
    task = box.create(title="send", prompt="send it", tools=["test.send"], facts={"email": "a@example.com"}, budgetCents=100)
    assert box.wait_state(task["id"], "waiting")["waitingFor"] == "approval"
    tools = {t["function"]["name"] for t in model.received[0].body["tools"]}
    assert "tool_test__send" in tools and "run_command" in tools
    assert calls == []  # nothing was sent before the OK
    approval = pending_approval(box, task["id"])
    assert approval["kind"] == "irreversible"
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert calls == [{"to": "a@example.com"}]  # the value was put in when the call executed
    assert '"sent": true' in model.received[1].messages[-1]["content"]

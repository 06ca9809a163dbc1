"""The tool registry seen from the API: specs, the tool list, owner tools, flow tool steps."""
from __future__ import annotations

from typing import Any

from tasks.models import Task
from tests.broker.conftest import Marks, events_of
from tests.factories import flow


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def test_a_spec_naming_a_tool_nobody_provides_is_invalid_and_names_the_tool(box: Any) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "prompt": "p", "tools": ["notify.owner", "shop.buy"]},
                            format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "INVALID_SPEC" and body["field"] == "tools" and "'shop.buy'" in body["message"]
    assert not Task.objects.exists()


def test_an_owner_tool_from_the_tools_file_is_a_valid_tool(box: Any, owner_tools: Any) -> None:
    task = box.create(title="t", prompt="p", worker="command", tools=["owner.free"], command=sh("true"))
    assert task["tools"] == ["owner.free"]


def test_the_tool_list_shows_built_in_and_owner_tools_with_cost_and_irreversibility(box: Any, owner_tools: Any) -> None:
    tools = {t["name"]: t for t in box.api.get("/api/tools").json()["tools"]}
    assert {"http.request", "notify.owner", "owner.free", "owner.paid", "owner.launch"} <= set(tools)
    assert tools["notify.owner"]["provider"] == "box" and tools["notify.owner"]["schema"]["required"] == ["message"]
    assert tools["owner.paid"]["costCents"] == 25 and tools["owner.paid"]["provider"] == "owner"
    assert tools["owner.launch"]["irreversible"] is True


def test_a_failing_owner_tool_reports_its_reason_to_the_process_and_the_log(box: Any, owner_tools: Any) -> None:
    task = box.create(title="t", prompt="p", worker="command", tools=["owner.broken"], command=sh("box tool owner.broken"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed"
    assert "tool 'owner.broken' failed: exited with 4: the shop is closed" in view["error"]
    result = events_of(box, task["id"], "tool_result")[0]
    assert result["data"]["ok"] is False and "the shop is closed" in result["data"]["error"]


def test_allow_destructive_lets_an_irreversible_tool_run_without_asking(box: Any, marks: Marks) -> None:
    task = box.create(title="t", prompt="p", worker="command", tools=["owner.launch"],
                      constraints={"allow_destructive": True}, command=sh("box tool owner.launch --args '{\"go\": 1}'"))
    view = box.wait_state(task["id"], "done", "failed", "waiting")
    assert view["state"] == "done", view
    assert marks.made(task["id"]) == [{"go": 1}]
    assert not box.task(task["id"])["approvals"]


def test_a_flow_tool_step_over_the_budget_pauses_first_and_approving_runs_it(box: Any, marks: Marks) -> None:
    task = box.create(title="t", tools=["owner.paid"], budgetCents=5,
                      flow=flow({"tool": "owner.paid", "args": {"what": "ticket"}}, {"run": "box step after"}))
    view = box.wait_state(task["id"], "waiting", "done", "failed")
    assert view["state"] == "waiting" and view["waitingFor"] == "approval"
    assert marks.made(task["id"]) == [] and view["costCents"] == 0
    approval = box.task(task["id"])["approvals"][0]
    assert approval["kind"] == "spending" and approval["amountCents"] == 20
    response = box.api.post(f"/api/approvals/{approval['id']}/approve", {}, format="json")
    assert response.status_code == 200, response.json()
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert marks.made(task["id"]) == [{"what": "ticket"}]
    assert view["costCents"] == 25 and view["budgetCents"] == 25


def test_the_same_irreversible_call_twice_in_one_task_is_one_action(box: Any, marks: Marks) -> None:
    call = "box tool owner.launch --args '{\"go\": 1}'"
    task = box.create(title="t", prompt="p", worker="command", tools=["owner.launch"],
                      constraints={"allow_destructive": True}, command=sh(f"{call} && {call} > second.json && cat second.json"))
    view = box.wait_state(task["id"], "done", "failed", "waiting")
    assert view["state"] == "done", view
    assert marks.made(task["id"]) == [{"go": 1}]  # the provider was called once
    (action,) = box.api.get(f"/api/tasks/{task['id']}/actions").json()["results"]
    assert (action["kind"], action["position"], action["state"]) == ("tool", "call", "succeeded")
    replayed = [e for e in events_of(box, task["id"], "tool_result") if e["data"].get("replayed")]
    assert len(replayed) == 1 and replayed[0]["data"]["receipt"]["result"] == {"done": True}

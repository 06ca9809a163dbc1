"""The `box` client from inside a task's process: steps, tools, refusals, limits."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from tasks.broker.paths import CLIENT_SOURCE
from tests.broker.conftest import Marks, events_of
from tests.factories import flow


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def test_a_command_task_reports_a_step_and_calls_a_tool_through_box(box: Any) -> None:
    task = box.create(title="report", worker="command", tools=["notify.owner"], prompt="p",
                      command=sh("box step hi && box tool notify.owner --args '{\"message\":\"x\"}'"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    events = box.events(task["id"])
    steps = [e["summary"] for e in events if e["kind"] == "step"]
    assert "hi" in steps
    call = next(e for e in events if e["kind"] == "tool_call")
    assert call["data"]["tool"] == "notify.owner" and call["data"]["args"] == {"message": "x"}
    result = next(e for e in events if e["kind"] == "tool_result")
    assert result["data"]["tool"] == "notify.owner" and result["data"]["ok"] is True
    said = result["data"]["result"]  # no notification URL is set here: the log only, and it says so
    assert said["delivered"] is False and "no notification URL" in said["why"]
    assert any(e["kind"] == "note" and "message for the owner: x" in e["summary"] for e in events)
    assert [e["seq"] for e in events].index(call["seq"]) < [e["seq"] for e in events].index(result["seq"])
    # the tool's result reached the process on stdout
    outputs = [e["summary"] for e in events if e["kind"] == "output"]
    assert json.loads(outputs[-1]) == said
    assert view["spent"]["actions"] == 1


def test_a_tool_the_task_does_not_list_is_refused_and_the_process_sees_it(box: Any) -> None:
    task = box.create(title="sneaky", worker="command", prompt="p", tools=[],
                      command=sh("box tool notify.owner --args '{\"message\":\"x\"}'; echo \"exit=$?\""))
    view = box.wait_state(task["id"], "done", "failed")
    events = box.events(task["id"])
    assert "exit=1" in [e["summary"] for e in events if e["kind"] == "output"]
    refused = events_of(box, task["id"], "tool_call")
    assert len(refused) == 1 and "not in this task's tools" in refused[0]["data"]["refused"]
    assert not events_of(box, task["id"], "tool_result")
    assert not any(e["kind"] == "note" and "message for the owner" in e["summary"] for e in events)
    assert view["spent"]["actions"] == 0


def test_a_refused_call_fails_a_task_whose_process_stops_on_it_with_a_one_line_reason(box: Any) -> None:
    task = box.create(title="sneaky", worker="command", prompt="p", tools=[],
                      command=sh("set -e; box tool notify.owner --args '{\"message\":\"x\"}'; echo never"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed"
    assert view["error"].startswith("worker exited with 1: box: tool 'notify.owner' is not in this task's tools")
    assert "TOOL_REFUSED" in view["error"]


def test_arguments_that_break_the_tool_schema_are_refused_with_the_reason(box: Any) -> None:
    task = box.create(title="bad args", worker="command", prompt="p", tools=["notify.owner"],
                      command=sh("box tool notify.owner --args '{\"msg\":\"x\"}'"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed"
    assert "bad arguments for 'notify.owner'" in view["error"] and "'message' is a required property" in view["error"]


def test_every_tool_call_counts_against_max_actions(box: Any) -> None:
    call = "box tool notify.owner --args '{\"message\":\"again\"}'"
    task = box.create(title="busy", worker="command", prompt="p", tools=["notify.owner"], limits={"max_actions": 2},
                      command=sh(f"{call} && {call} && box step between && {call}"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed"
    assert view["error"] == "the task used all of its max_actions (2)"
    assert view["recoverable"] is True and "raise limits.max_actions" in view["hint"]
    assert view["spent"]["actions"] == 2
    assert len(events_of(box, task["id"], "tool_result")) == 2


def test_flow_run_steps_reach_the_broker_too(box: Any) -> None:
    task = box.create(title="flow", tools=["notify.owner"], flow=flow(
        {"run": "box step from-the-flow --progress 0.5 && box tool notify.owner --args '{\"message\":\"from flow\"}'"}))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    events = box.events(task["id"])
    assert any(e["kind"] == "step" and e["summary"] == "from-the-flow" for e in events)
    assert any(e["kind"] == "note" and "from flow" in e["summary"] for e in events)


def test_an_owner_command_tool_runs_with_its_arguments_and_returns_its_output(box: Any, owner_tools: Any, marks: Marks) -> None:
    task = box.create(title="owner tool", worker="command", prompt="p", tools=["owner.free"],
                      command=sh("box tool owner.free --args '{\"n\": 7}' > out.json && cat out.json"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert marks.made(task["id"]) == [{"n": 7}]
    assert [e["summary"] for e in events_of(box, task["id"], "output")] == ['{"done": true}']


def test_a_paid_call_within_the_budget_records_its_cost(box: Any, owner_tools: Any, marks: Marks) -> None:
    task = box.create(title="paid", worker="command", prompt="p", tools=["owner.paid"], budgetCents=60,
                      command=sh("box tool owner.paid && box tool owner.paid"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    costs = events_of(box, task["id"], "cost")
    assert [c["costCents"] for c in costs] == [25, 25]
    assert view["costCents"] == 50 and len(marks.made(task["id"])) == 2


def test_box_spend_within_the_budget_adds_to_the_cost(box: Any) -> None:
    task = box.create(title="spend", worker="command", prompt="p", budgetCents=10,
                      command=sh("box spend 4 --reason 'an API call'"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert view["costCents"] == 4
    cost = events_of(box, task["id"], "cost")[0]
    assert cost["costCents"] == 4 and cost["data"]["reason"] == "an API call"


def test_http_request_to_a_host_the_task_does_not_list_is_blocked_and_logged(box: Any) -> None:
    task = box.create(title="http", worker="command", prompt="p", tools=["http.request"], hosts=["example.org"],
                      command=sh("box tool http.request --args '{\"url\": \"http://127.0.0.1:9/\"}'"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed"
    assert "blocked" in view["error"]
    blocked = events_of(box, task["id"], "blocked_connection")
    assert blocked and blocked[0]["data"]["host"] == "127.0.0.1" and blocked[0]["data"]["port"] == 9


def test_box_outside_a_task_says_so_and_exits_3() -> None:
    env = {k: v for k, v in os.environ.items() if k != "BOX_BROKER_SOCKET"}
    done = subprocess.run(["/usr/bin/python3", str(CLIENT_SOURCE), "step", "hi"], env=env, capture_output=True, text=True)
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and "only inside a task" in done.stderr


def test_box_with_bad_usage_exits_2_with_one_line() -> None:
    done = subprocess.run(["/usr/bin/python3", str(CLIENT_SOURCE), "tool", "x", "--args", "{nope"],
                          env={"BOX_BROKER_SOCKET": "/nonexistent"}, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("box: --args is not JSON")


def test_the_broker_works_when_the_data_directory_is_deeper_than_a_socket_address_allows(
        box: Any, settings: Any, tmp_path: Any) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    settings.BOX_DATA_DIR = deep
    task = box.create(title="deep", worker="command", prompt="p", command=sh("box step from-deep-down"))
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert any(e["summary"] == "from-deep-down" for e in events_of(box, task["id"], "step"))

"""Broken tool calls go back to the model: arguments that are not JSON, a tool it was not given,
arguments its schema refuses; a call written as text is run; an empty or cut answer is never the
task's answer."""
from __future__ import annotations

import json
from typing import Any

from tests.fakemodel import Answer, FakeModel, call, say
from tests.pauses.helpers import report


def read(box: Any, path: str) -> str:
    response = box.api.get("/api/workspaces/home/files", {"path": path})
    return str(response.json()["content"]) if response.status_code == 200 else ""


def last_sent(model: FakeModel, n: int) -> str:
    return json.dumps(model.received[n].messages[-1])


def test_arguments_that_are_not_json_go_back_to_the_model_which_fixes_them(box: Any, model: FakeModel) -> None:
    model.answer(Answer(tool_calls=[("write_file", '{"path": "a.txt", "content": "hal')]),
                 call("write_file", path="a.txt", content="whole"), call("finish", answer="written"))
    task = box.create(title="cut", prompt="write a.txt", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert "not JSON" in last_sent(model, 1)
    assert report(box, task["id"])["records"]["answer"] == "written"


def test_a_turn_with_broken_arguments_is_charged_and_answered_as_the_calls_result(box: Any, model: FakeModel) -> None:
    model.answer(Answer(tool_calls=[("write_file", '{"path": "a.txt", "content": "hal'),
                                    ("write_file", {"path": "b.txt", "content": "whole"})], usage=(1_000_000, 0)),
                 call("finish", answer="written"))
    task = box.create(title="paid", prompt="write a.txt and b.txt", budgetCents=500)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert done["costCents"] >= 100  # a million input tokens at 100¢/M: the broken turn is paid for
    sent = model.received[1].messages
    calls = sent[-3]["tool_calls"]
    assert sent[-3]["role"] == "assistant" and [c["function"]["name"] for c in calls] == ["write_file", "write_file"]
    broken, whole = sent[-2], sent[-1]
    assert broken["role"] == "tool" and broken["tool_call_id"] == calls[0]["id"] and "not JSON" in broken["content"]
    assert whole["role"] == "tool" and whole["tool_call_id"] == calls[1]["id"]  # the sound call of the same turn ran
    assert read(box, "b.txt") == "whole" and model.problems == []


def test_an_unknown_tool_is_answered_with_the_tools_there_are(box: Any, model: FakeModel) -> None:
    model.answer(call("teleport", to="mars"), call("finish", answer="ok"))
    task = box.create(title="t", prompt="go to mars", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    sent = model.received[1].messages[-1]
    assert sent["role"] == "tool" and "no tool 'teleport'" in sent["content"] and "run_command" in sent["content"]


def test_arguments_the_schema_refuses_are_answered_with_what_is_wrong(box: Any, model: FakeModel) -> None:
    model.answer(call("write_file", path="b.txt"), call("write_file", path="b.txt", content="fixed"), call("finish", answer="ok"))
    task = box.create(title="s", prompt="write b.txt", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert "'content' is a required property" in last_sent(model, 1)


def test_three_broken_calls_in_a_row_fail_the_task_recoverably(box: Any, model: FakeModel) -> None:
    model.fallback = call("teleport", to="mars")
    task = box.create(title="b", prompt="go", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["state"] == "failed" and failed["recoverable"] is True
    assert "3 broken tool calls in a row" in failed["error"] and "teleport" in failed["error"]
    assert len(model.received) == 3


def test_a_tool_call_written_as_text_is_run(box: Any, model: FakeModel) -> None:
    text = ('<think>I should write the file.</think>\n<tool_call>\n{"name": "write_file", '
            '"arguments": {"path": "t.txt", "content": "from text"}}\n</tool_call>')
    model.answer(say(text), say("<think>done, say so</think>wrote t.txt"))
    task = box.create(title="x", prompt="write t.txt", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert read(box, "t.txt") == "from text"
    second = model.received[1].messages
    assert second[-2]["tool_calls"][0]["function"]["name"] == "write_file"
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == second[-2]["tool_calls"][0]["id"]
    assert report(box, task["id"])["records"]["answer"] == "wrote t.txt"  # the thinking is not the answer


def test_an_empty_answer_cut_at_the_limit_is_nudged_once(box: Any, model: FakeModel) -> None:
    model.answer(Answer(content="", finish_reason="length"), say("the real answer"))
    task = box.create(title="e", prompt="answer", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert "continue, or finish with an answer" in last_sent(model, 1)
    assert report(box, task["id"])["records"]["answer"] == "the real answer"


def test_an_answer_cut_twice_fails_recoverably_naming_the_cut(box: Any, model: FakeModel) -> None:
    model.answer(Answer(content="half an ans", finish_reason="length"), Answer(content="", finish_reason="length"))
    task = box.create(title="e", prompt="answer", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["state"] == "failed" and failed["recoverable"] is True
    assert "cut at its output limit" in failed["error"]
    assert "answer" not in (report(box, task["id"])["records"] or {})

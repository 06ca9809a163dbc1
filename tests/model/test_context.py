"""Long tasks fit the context: the box counts what it sends, compacts older turns into a summary
near the window (a model call of its own, logged and charged), and shows a long tool result as
head and tail, the whole kept for the model to page through."""
from __future__ import annotations

import json
import re
from typing import Any

from tests.fakemodel import Answer, FakeModel, call, say

WINDOW = 16384


def tokens(body: dict[str, Any]) -> int:
    return (len(json.dumps(body.get("messages", []))) + len(json.dumps(body.get("tools", [])))) // 4


def test_a_40_turn_task_with_a_16k_window_passes_with_every_request_inside_it(box: Any, model: FakeModel) -> None:
    changed = box.api.patch("/api/settings/model", {"contextTokens": WINDOW}, format="json")  # Settings → Model
    assert changed.status_code == 200 and changed.json()["contextTokens"] == WINDOW, changed.json()
    sizes: list[int] = []
    turns: list[int] = []

    def answer(body: dict[str, Any]) -> Answer:
        size = tokens(body)
        sizes.append(size)
        if size + 2048 > WINDOW:  # as a real server does: past the window, an error
            return Answer(status=400, error=f"this model's maximum context length is {WINDOW} tokens")
        if "compact the earlier part" in body["messages"][0]["content"]:
            return say("Summary: the agent listed numbers with seq, 2500 lines each time; nothing failed.")
        assert body["messages"][0]["role"] == "system" and "box's agent" in body["messages"][0]["content"]
        assert "count to 2500 forty times" in body["messages"][1]["content"]  # the task stays whole
        turns.append(1)
        if len(turns) < 40:
            return call("run_command", command="seq 1 2500")
        return call("finish", answer="counted forty times")

    model.fallback = answer
    model.context_tokens = WINDOW  # the fake refuses a prompt and output asked for past the window, as vLLM does
    task = box.create(title="long", prompt="count to 2500 forty times", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed", timeout=300)
    assert done["state"] == "done", done
    assert len(turns) == 40 and max(sizes) + 2048 <= WINDOW
    events = box.events(task["id"])
    compactions = [e for e in events if e["kind"] == "step_result" and e["data"].get("kind") == "compaction"]
    assert compactions and all(c["data"]["tokensAfter"] < c["data"]["tokensBefore"] for c in compactions)
    # each compaction is a model call of its own, counted like a turn
    assert done["spent"]["model_calls"] == 40 + len(compactions) == len(sizes)
    assert model.problems == []


def test_an_8k_window_task_asks_for_output_that_fits_beside_its_prompt(box: Any, model: FakeModel) -> None:
    window = 8192
    assert box.api.patch("/api/settings/model", {"contextTokens": window}, format="json").status_code == 200
    model.context_tokens = window
    turns: list[int] = []

    def answer(body: dict[str, Any]) -> Answer:
        if "compact the earlier part" in body["messages"][0]["content"]:
            return say("Summary: the agent printed 2500 numbers a turn; nothing failed.")
        turns.append(1)
        return call("run_command", command="seq 1 2500") if len(turns) < 12 else call("finish", answer="done small")

    model.fallback = answer
    task = box.create(title="small window", prompt="count to 2500 twelve times", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed", timeout=300)
    assert done["state"] == "done", (done, model.problems[:1])
    assert model.problems == []
    asked = [r.body["max_completion_tokens"] for r in model.received]
    assert max(asked) <= window // 4  # most of a small window is kept for the conversation
    assert all(r.tokens + r.body["max_completion_tokens"] <= window for r in model.received)
    assert any(e["data"].get("kind") == "compaction" for e in box.events(task["id"]) if e["kind"] == "step_result")


def test_a_long_result_is_shown_as_head_and_tail_and_the_model_pages_through_the_whole(box: Any, model: FakeModel) -> None:
    model.answer(call("run_command", command="seq 1 20000"))

    def page(body: dict[str, Any]) -> Answer:
        shown = body["messages"][-1]["content"]
        name = re.search(r"output '([^']+-stdout.txt)'", shown)
        assert name, shown[:500]
        return call("read_output", name=name.group(1), start_line=10001, end_line=10003)

    model.answer(page, call("finish", answer="read it"))
    task = box.create(title="big", prompt="count", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    first = model.received[1].messages[-1]["content"]
    assert len(first) <= 24000 and "characters cut" in first and "19999\\n20000" in first
    paged = json.loads(model.received[2].messages[-1]["content"])
    assert paged["content"] == "10001: 10001\n10002: 10002\n10003: 10003"  # the whole stdout, not only its tail

"""The agent worker's overhead per model turn, beside the raw round-trip to the same endpoint
and the sandboxed command's own cost, measured in the same run.

A local chat-completions server (tests/fakemodel.py) answers a task's model turns instantly: each
asks for one `run_command` (`true`), the last says finish. A turn's time in the box is the time
from the endpoint answering to the next request leaving the box: recording the turn (step,
result, cost), running the command as the task's user in its sandbox, recording the tool call and
result, saving the conversation. The command's own cost is, per turn, the time from its
`tool_call` event to its `tool_result` event (the box's clock: the sandboxed start through the
run's resident init, the command, its evidence); the box's overhead is the turn's time less that,
paired turn by turn (the target: at most 15 ms plus the sandboxed command). The raw figure is one
`openai` client call to the same server.

Then the tokens a long task sends: a 40-turn task whose every command prints 2,500 lines, once
with a 16k context window (the agent compacts older turns into a summary near it) and once with
a window too large to reach; each request's size is counted as the box counts it (characters/4).
Usage: .venv/bin/python bench/model.py [--turns N] [--long-turns N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datetime import datetime  # noqa: E402

import openai  # noqa: E402
from harness import BenchBox, stop_on_signals  # noqa: E402

from tests.fakemodel import Answer, FakeModel, call, say  # noqa: E402


def raw_round_trips(server: FakeModel, turns: int) -> list[float]:
    client = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
    server.fallback = call("run_command", command="true")
    times = []
    for _ in range(turns):
        began = time.monotonic()
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "go"}])
        times.append((time.monotonic() - began) * 1000)
    return times


def box_overheads(box: BenchBox, server: FakeModel, turns: int) -> tuple[list[float], list[float], float]:
    """Per turn: the time from an answer to the next request, and the command's own time in it
    (its tool call to its result, in the log); and the whole task's time."""
    box.request("PATCH", "/api/settings/model", {"baseUrl": server.base_url, "model": "fake", "keyName": ""})
    server.received.clear()
    server.script = [call("run_command", command="true") for _ in range(turns)] + [call("finish", answer="done")]
    began = time.monotonic()
    task = box.post("/api/tasks", {"title": "model bench", "prompt": "run true a few times",
                                   "limits": {"max_actions": turns + 10}})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        view = box.get(f"/api/tasks/{task['id']}")
        if view["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.1)
    if view["state"] != "done":
        raise RuntimeError(f"the bench task ended {view['state']}: {view['error']}")
    total = (time.monotonic() - began) * 1000
    got = server.received
    gaps = [(later.at - earlier.answered_at) * 1000 for earlier, later in zip(got, got[1:])]
    return gaps, command_times(box, task["id"]), total


def command_times(box: BenchBox, task_id: str) -> list[float]:
    """Each run_command's time from its tool_call event to its tool_result event, in ms."""
    events = box.get(f"/api/tasks/{task_id}/events?limit=1000")["events"]
    called = {e["data"]["call"]: datetime.fromisoformat(e["createdAt"]) for e in events
              if e["kind"] == "tool_call" and e["data"].get("tool") == "run_command"}
    return [(datetime.fromisoformat(e["createdAt"]) - called[e["data"]["call"]]).total_seconds() * 1000 for e in events
            if e["kind"] == "tool_result" and e["data"].get("call") in called]


def _wait_done(box: BenchBox, task_id: str) -> None:
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        view = box.get(f"/api/tasks/{task_id}")
        if view["state"] in ("done", "failed", "cancelled"):
            if view["state"] != "done":
                raise RuntimeError(f"the bench task ended {view['state']}: {view['error']}")
            return
        time.sleep(0.2)
    raise RuntimeError("the bench task did not end in 15 minutes")


def long_task_tokens(box: BenchBox, server: FakeModel, turns: int, window: int) -> tuple[int, int, int]:
    """(tokens sent in all, the largest request, compactions) for a ``turns``-turn task."""
    box.request("PATCH", "/api/settings/model", {"baseUrl": server.base_url, "model": "fake", "keyName": "",
                                                 "contextTokens": window})
    server.received.clear()
    done: list[int] = []

    def answer(body: dict[str, object]) -> Answer:
        messages = body.get("messages") or []
        if messages and "compact the earlier part" in str(messages[0]):  # type: ignore[index]
            return say("Summary: the agent printed 2,500 numbers each turn; nothing failed.")
        done.append(1)
        return call("run_command", command="seq 1 2500") if len(done) < turns else call("finish", answer="counted")

    server.script = []
    server.fallback = answer
    task = box.post("/api/tasks", {"title": "long model bench", "prompt": f"count to 2500, {turns} times",
                                   "limits": {"max_actions": turns + 10, "max_model_calls": 4 * turns}})
    _wait_done(box, task["id"])
    sizes = []
    compactions = 0
    for got in server.received:
        body = json.loads(got.raw or b"{}")
        messages = body.get("messages", [])
        compactions += bool(messages) and "compact the earlier part" in str(messages[0])
        sizes.append((len(json.dumps(messages)) + len(json.dumps(body.get("tools", [])))) // 4)
    return sum(sizes), max(sizes), compactions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--long-turns", type=int, default=40)
    args = parser.parse_args()
    stop_on_signals()
    server = FakeModel()
    load_before = os.getloadavg()[0]
    try:
        raw = raw_round_trips(server, args.turns)
        with BenchBox() as box:
            gaps, commands, total = box_overheads(box, server, args.turns)
            compacted = long_task_tokens(box, server, args.long_turns, 16384)
            whole = long_task_tokens(box, server, args.long_turns, 10_000_000)
    finally:
        server.close()
    # The turns with a command: the first len(commands) gaps (the last answer is finish).
    beyond = [gap - command for gap, command in zip(gaps, commands)]
    print(f"agent turns against a local chat-completions server (milliseconds; {args.turns} turns; "
          f"load {load_before:.1f} → {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for label, values in (("raw round-trip (openai client)", raw),
                          ("a turn in the box (answer -> next request)", gaps),
                          ("  of it the sandboxed command (tool call -> result)", commands),
                          ("  of it the box beyond the command (target <= 15)", beyond)):
        print(f"{label:<52} median {statistics.median(values):>7.1f}   p90 {sorted(values)[int(len(values) * 0.9)]:>7.1f}")
    print(f"{'whole task, created to done':<52} {total:>14.0f}")
    print(f"a {args.long_turns}-turn task printing 2,500 lines a turn (tokens, counted as characters/4)")
    for label, (sent, largest, compactions) in (("16k window (compacts near it)", compacted),
                                                 ("no reachable window (never compacts)", whole)):
        print(f"{label:<52} sent {sent:>9}   largest request {largest:>7}   compactions {compactions}")


if __name__ == "__main__":
    main()

"""A target described in plain words: the model picks it from the page (against a real local
chat-completions server), the choice is logged with its prompt and decision, and what worked is
replayed from memory or the box's cache with no model call, or grounded again when the remembered
element is gone (the cache's own guarantees: tests/browser/test_grounding_cache.py)."""
from __future__ import annotations

import re
from typing import Any

from tests.factories import flow
from tests.fakemodel import (
    Answer,
    fake_model,  # noqa: F401 - fixture
    say,
)
from tests.model.conftest import model  # noqa: F401 - fixture

CHEAPEST = "the cheapest flight's Select button"
PLAY = "the Play flight's Select button"


def pick_cheapest(body: dict[str, Any]) -> Answer:
    """Read the elements the box sent and answer with the ref of the cheapest offer's button."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    offers = re.findall(r'\[(\d+)\] button "Select" — in: \w+ [\d:]+ ₹([\d,]+)', prompt)
    assert offers, prompt
    ref = min(offers, key=lambda o: int(o[1].replace(",", "")))[0]
    return say(f'{{"ref": {ref}, "why": "lowest fare"}}')


def run(box: Any, site: Any, instruction: str, **flow_keys: Any) -> dict[str, Any]:
    steps = flow({"browse": f"{site.url}/shop"}, {"click": {"describe": instruction}}, {"extract": "h1", "save": "heading"})
    steps.update(flow_keys)
    task = box.create(title="ground", hosts=["127.0.0.1"], budgetCents=100, flow=steps)
    view = box.wait_state(task["id"], "done", "failed", "waiting", timeout=90)
    assert view["state"] == "done", (view, [e["summary"] for e in box.events(task["id"])])
    return task


def grounding_of(box: Any, task_id: str) -> dict[str, Any]:
    [click] = [e for e in box.events(task_id) if e["kind"] == "step_result" and e["data"]["kind"] == "click"]
    return click["data"]["grounding"]


def test_the_model_finds_the_element_then_memory_replays_it_with_no_model_call(sandboxed, site, model):  # noqa: F811
    model.fallback = pick_cheapest
    first = run(sandboxed, site, CHEAPEST, trace=True)
    assert len(model.received) == 1
    found = grounding_of(sandboxed, first["id"])
    assert found["from"] == "model" and found["instruction"] == CHEAPEST
    assert 'button "Select"' in found["prompt"] and found["decision"]["content"].startswith('{"ref"')
    assert found["trace"]["messages"][1]["content"].startswith("Step: click")
    report = sandboxed.api.get(f"/api/tasks/{first['id']}/report").json()
    assert report["records"]["heading"] == [{"value": "You chose Play 09:10"}]
    assert report["memory"] == [{"instruction": CHEAPEST, "page": f"{site.url}/shop", "selector": found["selector"]}]

    # "The cheapest" is a question about the page's prices now: the model is asked every time.
    again = run(sandboxed, site, CHEAPEST)
    assert len(model.received) == 2 and "cheapest" in grounding_of(sandboxed, again["id"])["fresh"]

    # An instruction that names its element is replayed from the box's own cache: no model call.
    named = run(sandboxed, site, PLAY)
    assert len(model.received) == 3 and grounding_of(sandboxed, named["id"])["selector"] == found["selector"]
    second = run(sandboxed, site, PLAY)
    assert len(model.received) == 3
    assert grounding_of(sandboxed, second["id"])["from"] == "cache"
    assert sandboxed.api.get(f"/api/tasks/{second['id']}/report").json()["records"]["heading"] == [{"value": "You chose Play 09:10"}]

    # Hints a flow brings from an earlier run: one that still finds its element is used as it is...
    hinted = run(sandboxed, site, "the Play flight", memory=[{"instruction": "the Play flight", "selector": found["selector"]}])
    assert len(model.received) == 3 and grounding_of(sandboxed, hinted["id"])["from"] == "memory"
    # ...and one whose element is gone is grounded again.
    stale = run(sandboxed, site, "the Play fare's button", memory=[{"instruction": "the Play fare's button", "selector": "#gone"}])
    assert len(model.received) == 4
    grounded = grounding_of(sandboxed, stale["id"])
    assert grounded["from"] == "model" and grounded["forgotten"] == ["#gone"] and grounded["selector"] == found["selector"]

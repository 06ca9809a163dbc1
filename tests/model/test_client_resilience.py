"""Model calls against what real endpoints do: busy answers (429 with Retry-After, 503), dropped
connections and slow writers (points 1 and 2 of issue 34), through real tasks and through the
client against the conformance fake."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import pytest

from tasks.llm.client import ModelConfig, ModelError, Usage, call_model
from tests.fakemodel import Answer, FakeModel, busy, call, say, thinking


def report(box: Any, task_id: str) -> dict[str, Any]:
    return dict(box.api.get(f"/api/tasks/{task_id}/report").json())


def notes(box: Any, task_id: str) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if e["kind"] == "note" and "modelAttempt" in e["data"]]


def config(fake: FakeModel, model: str = "fake-model", **fields: Any) -> ModelConfig:
    return ModelConfig(base_url=fake.base_url, model=model, key_name="", **fields)


def test_a_rate_limited_call_waits_as_asked_then_the_task_goes_on(box: Any, model: FakeModel) -> None:
    model.answer(busy(retry_after="1"), call("finish", answer="done after the wait"))
    task = box.create(title="x", prompt="do it", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    first, second = model.received
    assert second.at - first.answered_at >= 0.95  # Retry-After: 1
    [note] = notes(box, task["id"])
    assert "try 1 of 5" in note["summary"] and "HTTP 429" in note["summary"]
    assert done["spent"]["model_calls"] == 1  # one call, tried twice


def test_retry_after_as_an_http_date_is_honoured(fake_model: FakeModel) -> None:
    when = datetime.now(timezone.utc) + timedelta(seconds=2)
    fake_model.answer(busy(retry_after=format_datetime(when, usegmt=True), status=503), say("ready"))
    decision = call_model(config(fake_model), [{"role": "user", "content": "hi"}], key="k")
    assert decision.content == "ready" and decision.attempts == 2
    first, second = fake_model.received
    assert second.at - first.answered_at >= 0.9  # the date is whole seconds: at least one second ahead


def test_503s_and_a_cut_connection_are_tried_again_and_charged_once(box: Any, model: FakeModel) -> None:
    model.answer(busy(retry_after=None, status=503), Answer(content="a long answer cut off in the middle", cut=True),
                 Answer(tool_calls=[("finish", {"answer": "made it"})], usage=(1_000_000, 0)))
    task = box.create(title="x", prompt="do it", budgetCents=500)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert len(model.received) == 3
    assert done["costCents"] == 100  # one million input tokens at 100¢/M: the answering try only
    assert len(notes(box, task["id"])) == 2


def test_tries_are_bounded_then_the_task_fails_recoverably(box: Any, model: FakeModel, settings: Any) -> None:
    settings.BOX_MODEL_RETRY_TRIES = 3
    model.fallback = busy(retry_after="0", status=503)
    task = box.create(title="x", prompt="do it", budgetCents=100)
    failed = box.wait_state(task["id"], "failed", "done")
    assert failed["recoverable"] is True and "HTTP 503" in failed["error"] and "(3 tries)" in failed["error"]
    assert len(model.received) == 3 and failed["costCents"] == 0


def test_a_request_the_endpoint_refuses_is_not_tried_again(fake_model: FakeModel) -> None:
    fake_model.answer(Answer(status=400, error="bad request"))
    with pytest.raises(ModelError, match="HTTP 400"):
        call_model(config(fake_model), [{"role": "user", "content": "hi"}], key="k")
    assert len(fake_model.received) == 1


def test_a_slow_model_still_writing_is_not_cut_by_the_idle_timeout(fake_model: FakeModel) -> None:
    fake_model.answer(Answer(content="word " * 8, chunk_delay_s=0.2))  # 10 chunks: 2 s in all
    began = time.monotonic()
    decision = call_model(config(fake_model, idle_timeout_s=0.6), [{"role": "user", "content": "hi"}], key="k")
    assert time.monotonic() - began > 1.5
    assert decision.content == ("word " * 8).strip() and decision.attempts == 1
    assert fake_model.received[0].body["stream"] is True


def test_tool_arguments_split_across_chunks_and_usage_from_the_last_chunk(fake_model: FakeModel) -> None:
    arguments = {"path": "reports/2026/summary.md", "content": "# Summary\n" + "line\n" * 30}
    fake_model.answer(Answer(tool_calls=[("write_file", arguments), ("list_files", {"path": "."})], usage=(1234, 56),
                             cached_tokens=1000))
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("write_file", "list_files")]
    cfg = config(fake_model, input_cents_per_million=100, output_cents_per_million=200, cached_input_cents_per_million=10)
    decision = call_model(cfg, [{"role": "user", "content": "write it"}], tools=tools, key="k")
    assert [(c.name, c.arguments) for c in decision.tool_calls] == [("write_file", arguments), ("list_files", {"path": "."})]
    assert decision.usage == Usage(input_tokens=1234, output_tokens=56, cached_input_tokens=1000)
    assert decision.cost_cents == pytest.approx((234 * 100 + 1000 * 10 + 56 * 200) / 1_000_000)
    assert fake_model.received[0].body["stream_options"] == {"include_usage": True}


def test_cached_tokens_are_charged_at_the_cached_price_set_in_settings(box: Any, model: FakeModel) -> None:
    shown = box.api.patch("/api/settings/model", {"cachedInputCentsPerMillion": 10}, format="json").json()
    assert shown["cachedInputCentsPerMillion"] == 10
    model.answer(Answer(tool_calls=[("finish", {"answer": "ok"})], usage=(2_000_000, 0), cached_tokens=2_000_000))
    task = box.create(title="x", prompt="do it", budgetCents=500)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["costCents"] == 20  # two million cached tokens at 10¢/M, not 200¢ at the input price


def test_a_stream_without_usage_is_charged_an_estimate_from_its_characters(box: Any, model: FakeModel) -> None:
    assert box.api.patch("/api/settings/model", {"inputCentsPerMillion": 10_000}, format="json").status_code == 200
    model.refuses = {"stream_options"}  # the box drops it: the stream then carries no usage
    model.answer(call("finish", answer="done without usage"))
    task = box.create(title="x", prompt="do it", budgetCents=500)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert "stream_options" not in model.received[-1].body
    turn = next(e for e in box.events(task["id"]) if e["kind"] == "step_result" and e["data"].get("kind") == "model")
    assert turn["data"]["usage"]["estimated"] is True and "usage estimated" in turn["summary"]
    assert turn["data"]["usage"]["inputTokens"] >= model.received[-1].tokens  # the prompt, counted as characters/4
    assert done["costCents"] >= 1  # thousands of tokens at 100¢ a thousand, not 0


def test_a_gpt5_model_is_sent_max_completion_tokens(fake_model: FakeModel) -> None:
    fake_model.answer(say("ready"))
    call_model(config(fake_model, model="gpt-5-mini"), [{"role": "user", "content": "hi"}], key="k")
    body = fake_model.received[0].body
    assert body["max_completion_tokens"] == 8192 and "max_tokens" not in body
    assert fake_model.problems == []


def test_an_endpoint_refusing_max_completion_tokens_gets_max_tokens_and_it_is_remembered(fake_model: FakeModel) -> None:
    fake_model.refuses = {"max_completion_tokens"}
    cfg = config(fake_model, model="an-older-server-model")
    fake_model.answer(say("one"), say("two"))
    assert call_model(cfg, [{"role": "user", "content": "hi"}], key="k").content == "one"
    assert call_model(cfg, [{"role": "user", "content": "hi"}], key="k").content == "two"
    sent = [r.body for r in fake_model.received]
    assert ["max_completion_tokens" in b for b in sent] == [True, False, False]
    assert [b.get("max_tokens") for b in sent] == [None, 8192, 8192]


def test_the_reasoning_effort_setting_is_validated_and_sent(box: Any, model: FakeModel) -> None:
    refused = box.api.patch("/api/settings/model", {"reasoningEffort": "extreme"}, format="json")
    assert refused.status_code == 400 and refused.json()["field"] == "reasoningEffort"
    assert box.api.patch("/api/settings/model", {"reasoningEffort": "high"}, format="json").json()["reasoningEffort"] == "high"
    model.answer(call("finish", answer="ok"))
    task = box.create(title="x", prompt="do it", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert model.received[-1].body["reasoning_effort"] == "high"
    assert box.api.patch("/api/settings/model", {"reasoningEffort": None}, format="json").json()["reasoningEffort"] is None


def test_thinking_is_taken_out_of_the_answer(box: Any, model: FakeModel) -> None:
    model.answer(thinking("The owner wants a greeting. I will say hello.", "Hello, owner."))
    task = box.create(title="x", prompt="greet me", budgetCents=100)
    assert box.wait_state(task["id"], "done", "failed")["state"] == "done"
    assert report(box, task["id"])["records"]["answer"] == "Hello, owner."


def test_thinking_and_fences_are_taken_out_of_a_json_answer(fake_model: FakeModel) -> None:
    fake_model.answer(thinking("Let me build the object.", 'Here it is:\n```json\n{"ready": true}\n```'))
    decision = call_model(config(fake_model), [{"role": "user", "content": "json"}], schema={"type": "object"}, key="k")
    assert decision.json_answer() == {"ready": True} and "build the object" in decision.reasoning


def test_the_fake_refuses_what_strict_servers_refuse(fake_model: FakeModel) -> None:
    unpaired = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
    with pytest.raises(ModelError, match="HTTP 400.*call_9"):
        call_model(config(fake_model), unpaired, key="k")
    fake_model.context_tokens = 50
    with pytest.raises(ModelError, match="context length exceeded"):
        call_model(config(fake_model), [{"role": "user", "content": "word " * 400}], key="k")
    assert len(fake_model.received) == 2 and len(fake_model.problems) == 2

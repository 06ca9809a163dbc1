"""GET /metrics sees an agent task's model calls: their latency and what they cost."""
from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.fakemodel import FakeModel, call


def _samples(box: Any) -> dict[str, float]:
    response = box.api.get("/metrics")
    assert response.status_code == 200
    return {sample.name: sample.value for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples if not sample.labels or sample.labels == {"le": "+Inf"}}


def test_an_agent_tasks_model_calls_show_in_the_latency_histogram_and_the_cost(box: Any, model: FakeModel) -> None:
    model.answer(call("write_file", path="a.txt", content="a"), call("finish", answer="wrote a.txt"))
    task = box.create(title="one file", prompt="write a.txt", budgetCents=100)
    done = box.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done

    samples = _samples(box)

    assert samples["box_model_call_seconds_count"] == 2
    assert samples["box_model_call_seconds_sum"] > 0
    assert samples["box_cost_cents_total"] == done["costCents"]

"""GET /metrics: an operator's Prometheus scrape, for an API token only."""
from __future__ import annotations

from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Box
from tests.factories import flow


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_without_a_token_it_answers_401_in_the_error_shape(box: Box) -> None:
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert response.json()["code"] == "UNAUTHENTICATED"
    wrong = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer not-a-token")
    assert wrong.status_code == 401 and wrong.json()["message"]


def test_it_counts_tasks_runs_steps_and_cost_after_a_task_ran(box: Box) -> None:
    task = box.create(title="two steps", flow=flow({"write": {"path": "a.txt", "content": "hi"}}, {"run": "cat a.txt"}))
    box.wait_state(task["id"], "done")

    response = box.api.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = _samples(response.content.decode())
    assert samples[("box_tasks", (("state", "done"),))] == 1
    assert samples[("box_tasks", (("state", "failed"),))] == 0
    assert samples[("box_runs", (("state", "finished"),))] >= 1
    assert samples[("box_queue_depth", ())] == 0
    assert samples[("box_sandbox_starts_total", ())] >= 1
    assert samples[("box_step_duration_seconds_count", ())] == 2
    assert ("box_model_call_seconds_count", ()) in samples
    assert ("box_cost_cents_total", ()) in samples
    assert samples[("box_browser_processes", ())] >= 0

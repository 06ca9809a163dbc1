"""On a real django-q2 cluster: a flow runs out of a limit, the owner raises it and retries, and
the task ends done without running again the steps that had finished, with the files written
before the failure still there (both layer drivers; both databases through the suite's runs)."""
from __future__ import annotations

import os
from typing import Any

import pytest
from django.conf import settings

from tasks.layers import paths
from tasks.layers.tree import Meta
from tasks.models import Run
from tests.cluster import running_box
from tests.conftest import Box, queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.layers.conftest import read

# Every step that runs appends its name to effects.txt (the side effect a re-run would repeat).
FLOW = flow(
    {"run": "echo fetched > data.txt && echo step1 >> effects.txt", "name": "fetch"},
    {"run": "echo step2 >> effects.txt", "name": "transform"},
    {"run": "test -f data.txt && echo step3 >> effects.txt && cat effects.txt", "name": "report", "save": "effects"},
)


@pytest.fixture(autouse=True)
def _cluster_mode(settings: Any) -> None:
    queue_through_the_cluster(settings)


def test_a_task_that_ran_out_of_actions_is_retried_and_finishes_without_repeating_steps(lbox: Box, driver: str,
                                                                                       tmp_path: Any) -> None:
    # the data dir is per test here, so the signing key (kept in the data dir by default) is passed on
    with running_box(tmp_path, BOX_LAYER_DRIVER=driver, DJANGO_SECRET_KEY=settings.SECRET_KEY):
        task = lbox.create(title="three steps, two actions", flow=FLOW, limits={"max_actions": 2})
        failed = lbox.wait_state(task["id"], "failed", "done", timeout=90)
        assert failed["state"] == "failed" and failed["recoverable"] is True, failed
        assert "retry" in failed["next"] and "limits.max_actions" in failed["hint"], failed
        # the cluster's release seals the layer: the retry reopens it
        wait_for(lambda: Meta.load(paths.layer_dir(task["id"])).sealed, timeout=30, what="the failed layer to be sealed")

        response = lbox.api.post(f"/api/tasks/{task['id']}/retry", {"limits": {"max_actions": 3}}, format="json")
        assert response.status_code == 200, response.json()
        done = lbox.wait_state(task["id"], "done", "failed", timeout=90)
    assert done["state"] == "done", done
    assert done["limits"]["max_actions"] == 3
    # step 1 and 2 ran once, before the failure; step 3 once, after the retry
    assert read(lbox, "effects.txt") == "step1\nstep2\nstep3\n"
    assert read(lbox, "data.txt") == "fetched\n"
    steps = [e["data"]["step"] for e in lbox.events(task["id"]) if e["kind"] == "step"]
    assert steps == [1, 2, 3], steps
    runs = lbox.api.get(f"/api/tasks/{task['id']}/runs", {"sort": "number"}).json()["results"]
    assert [(r["mode"], r["state"], r["outcome"]) for r in runs] == [("start", "finished", "failed"),
                                                                      ("retry", "finished", "done")], runs
    retried = Run.objects.get(task_id=task["id"], number=2)
    assert retried.worker_pid not in (None, os.getpid())  # the cluster ran it, not this process

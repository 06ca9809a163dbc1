"""Recovery with real processes: a killed worker, a lost lease, duplicate deliveries."""
from __future__ import annotations

import os
import signal

import pytest
from django.conf import settings
from django_q.models import OrmQ
from django_q.tasks import async_task

from tasks.models import Run, Task
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow

pytestmark = pytest.mark.usefixtures("cluster_mode")

# Blocks on the first attempt (long enough to be killed), passes on any later one.
BLOCK_ONCE = flow({"run": "if [ -f .attempted ]; then echo second; else touch .attempted; sleep 20; fi", "name": "slow step"},
                  {"write": {"path": "after.txt", "content": "ok"}})
ALWAYS_BLOCK = flow({"run": "sleep 20", "name": "hangs"})


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)
    settings.BOX_MAX_RUN_ATTEMPTS = 3


def _running_run(task_id: str, number: int) -> Run | None:
    run = Run.objects.filter(task_id=task_id, number=number, state="running").first()
    if run is None or not run.worker_pid:
        return None
    # Wait until the step itself is under way, so the kill lands mid-step.
    steps = Task.objects.get(pk=task_id).event_seq
    return run if steps >= 3 else None


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def test_a_flow_task_created_over_http_runs_on_a_real_cluster(box, tmp_path):
    with running_box(tmp_path, scheduler=False):
        task = box.create(title="real cluster", flow=flow({"run": "echo one"}, {"write": {"path": "b.txt", "content": "b"}}, {"run": "cat b.txt"}))
        view = box.wait_state(task["id"], "done", "failed", timeout=60)
    assert view["state"] == "done", view
    steps = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "step"]
    assert len(steps) == 3 and "step 1/3" in steps[0] and "step 3/3" in steps[2]
    run = Run.objects.get(task_id=task["id"])
    assert run.state == "finished" and run.worker_pid != os.getpid()


def test_a_killed_worker_is_retried_and_the_task_ends_done(box, tmp_path):
    with running_box(tmp_path):
        task = box.create(title="survives", flow=BLOCK_ONCE)
        first = wait_for(lambda: _running_run(task["id"], 1), timeout=60, what="the first run to be mid-step")
        _kill(first.worker_pid)
        view = box.wait_state(task["id"], "done", "failed", timeout=90)
    assert view["state"] == "done", view
    runs = list(Run.objects.filter(task_id=task["id"]).order_by("number").values_list("kind", "state", "attempt"))
    assert runs[0] == ("start", "lost", 1)
    assert runs[-1] == ("retry", "finished", 2)
    notes = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "note"]
    assert any("worker lost" in n for n in notes)
    assert Task.objects.get(pk=task["id"]).records == {}  # nothing saved twice


def test_a_worker_lost_every_time_fails_the_task_at_the_attempt_limit(box, tmp_path, settings):
    with running_box(tmp_path, BOX_MAX_RUN_ATTEMPTS="2"):
        task = box.create(title="doomed", flow=ALWAYS_BLOCK)
        for number in (1, 2):
            run = wait_for(lambda n=number: _running_run(task["id"], n), timeout=60, what=f"run {number} to be mid-step")
            _kill(run.worker_pid)
        view = box.wait_state(task["id"], "failed", timeout=90)
    assert "gave up after 2 attempts" in view["error"]
    # Both attempts were cut by a kill of their worker, and the message says so.
    assert "the worker was lost 2 times: 2 killed, 0 cut by a restart of the box, 0 by an expired lease" in view["error"], view
    assert view["recoverable"] is True and view["hint"]
    assert Run.objects.filter(task_id=task["id"]).count() == 2
    assert not Run.objects.filter(task_id=task["id"], state__in=["queued", "running"]).exists()


def test_the_same_run_delivered_twice_executes_once(box, tmp_path):
    task = box.create(title="twice", flow=flow({"run": "echo once >> log.txt"}, {"run": "cat log.txt"}))
    run = Run.objects.get(task_id=task["id"])
    # The create already enqueued it once; deliver it a second time before any worker runs.
    async_task("tasks.jobs.execute_run", run.pk)
    if not settings.REDIS_URL:
        assert OrmQ.objects.count() == 2
    with running_box(tmp_path, scheduler=False):
        view = box.wait_state(task["id"], "done", "failed", timeout=60)
        wait_for(lambda: _queue_empty(), timeout=30, what="both deliveries to be consumed")
    assert view["state"] == "done"
    steps = [e for e in box.events(task["id"]) if e["kind"] == "step"]
    assert len(steps) == 2
    assert Run.objects.filter(task_id=task["id"]).count() == 1


def _queue_empty() -> bool:
    if settings.REDIS_URL:
        return True
    return not OrmQ.objects.exists()

"""After the box restarts, a task that was running says so at once ("the box restarted; resuming
step N"), not after its lease runs out, and the step run again is marked as a retry."""
from __future__ import annotations

import os
import signal
import time

import pytest

from tasks.layers import paths
from tasks.models import Run, RunState, Task
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow

FIRST_TRY_HANGS = flow(
    {"write": {"path": "a.txt", "content": "a"}},
    {"run": "if [ -f .attempted ]; then echo again; else touch .attempted; sleep 60; fi", "name": "long"},
)


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)


def _killed(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_restart_is_narrated_at_once_and_the_cut_off_step_runs_again_as_a_retry(cluster_mode, box, tmp_path):
    with running_box(tmp_path, BOX_LEASE_SECONDS="120") as procs:
        task = box.create(title="restarted", flow=FIRST_TRY_HANGS)
        wait_for(lambda: Task.objects.get(pk=task["id"]).step.startswith("step 2/2"), timeout=60, what="step 2 to start")
        marks = [paths.layer_dir(task["id"]) / "upper" / ".attempted", paths.view_dir(task["id"]) / ".attempted"]
        wait_for(lambda: any(m.exists() for m in marks), timeout=30, what="the first try to be under way")
        run = Run.objects.get(task_id=task["id"], state=RunState.RUNNING)
        for proc in procs.values():  # the whole box goes down at once, as on a power cut
            os.killpg(proc.pid, signal.SIGKILL)
        os.kill(run.worker_pid, signal.SIGKILL)
        wait_for(lambda: _killed(run.worker_pid), timeout=10, what="the worker to be gone")
    restarted_at = time.monotonic()
    with running_box(tmp_path, BOX_LEASE_SECONDS="120"):
        view = box.wait_state(task["id"], "done", "failed", timeout=60)
    assert time.monotonic() - restarted_at < 60  # long before the 120 s lease would have expired
    assert view["state"] == "done", view["error"]
    events = box.events(task["id"])
    notes = [e["summary"] for e in events if e["kind"] == "note"]
    assert "the box restarted; resuming step 2" in notes
    assert not any("lease expired" in n for n in notes)
    starts = [e for e in events if e["kind"] == "step" and e["data"].get("step") == 2]
    assert [s["data"].get("retry", False) for s in starts] == [False, True]
    assert starts[1]["summary"].endswith("(retry)")
    results = [e for e in events if e["kind"] == "step_result" and e["data"]["step"] == 2]
    assert [r["data"]["stdout"] for r in results] == ["again"]

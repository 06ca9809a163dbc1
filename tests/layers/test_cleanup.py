"""Cleanup always unmounts: after a worker is killed mid-task, and at start-up for leftovers."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tasks.layers import mounts, paths
from tasks.models import Task
from tasks.run import lifecycle
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow

BLOCK = flow({"run": "echo partial > part.txt; i=0; while [ ! -e go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"})


def _views(task_id: str) -> list[Path]:
    return [p for root in paths.mount_roots(task_id) for p in mounts.mounts_under(root)]


@pytest.fixture(autouse=True)
def _cluster_mode(settings: Any) -> None:
    queue_through_the_cluster(settings)


def _running_in_a_killed_cluster(lbox: Any, tmp_path: Path, driver: str) -> dict[str, Any]:
    # the data dir is per test here, so the signing key (kept in the data dir by default) is passed on
    with running_box(tmp_path, scheduler=False, BOX_LAYER_DRIVER=driver,
                     DJANGO_SECRET_KEY=settings.SECRET_KEY) as procs:
        task = lbox.create(title="blocked", flow=BLOCK)
        view = settings.BOX_DATA_DIR / "tasks" / task["id"] / "view"
        wait_for(lambda: (view / "part.txt").exists(), timeout=60, what="the task to write in its view")
        if driver == "overlay":
            assert _views(task["id"]), "the overlay view is mounted while the task runs"
        os.killpg(procs["worker"].pid, signal.SIGKILL)  # the worker dies mid-task, cleanup never ran
        procs["worker"].wait()
    return task


def test_cancelling_a_task_whose_worker_was_killed_unmounts_and_keeps_its_diff(lbox, driver, tmp_path):
    task = _running_in_a_killed_cluster(lbox, tmp_path, driver)
    response = lbox.api.post(f"/api/tasks/{task['id']}/cancel")
    assert response.status_code == 200, response.json()
    # The release runs in the background (tasks.run.lifecycle's janitor), right after the cancel.
    wait_for(lambda: _views(task["id"]) == [], what="the cancelled task's view to be unmounted")
    wait_for(lambda: not (settings.BOX_DATA_DIR / "tasks" / task["id"] / "view").exists(), what="its view to go")
    assert lbox.api.get(f"/api/tasks/{task['id']}/diff").json()["added"] == ["part.txt"]


def test_start_up_reconcile_unmounts_what_a_crash_left_behind(lbox, driver, tmp_path):
    task = _running_in_a_killed_cluster(lbox, tmp_path, driver)
    # the box died after the task's final move committed, before its cleanup ran
    Task.objects.filter(pk=task["id"]).update(state="failed", error="the box stopped")
    lifecycle.reconcile()
    assert _views(task["id"]) == []
    assert lbox.api.get(f"/api/tasks/{task['id']}/diff").json()["added"] == ["part.txt"]

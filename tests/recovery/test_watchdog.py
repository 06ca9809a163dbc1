"""A bare worker cluster (``manage.py runcluster``, no supervisor) notices that runs wait while it
claims nothing, says so, and restarts itself: killed idle workers (one of them holds the queue's
read lock, a known django-q2 bug) or a frozen pool never strand a later task."""
from __future__ import annotations

import os
import signal

import pytest

from boxsite.core import procs
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.test_runbox import _children

pytestmark = pytest.mark.usefixtures("cluster_mode")

QUICK = flow({"run": "echo quick"})


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)


def _pool(leader: int) -> list[int]:
    """The processes below the cluster's sentinel: its workers, pusher and monitor."""
    sentinels = [pid for pid in _children(leader) if procs.parent(pid) == leader]
    return sorted(pid for sentinel in sentinels for pid in _children(sentinel) if procs.parent(pid) == sentinel)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # gone already (the cluster's watchdog may be restarting it)





def test_killed_idle_workers_and_a_frozen_pool_never_strand_tasks(box, tmp_path):
    env = {"BOX_WORKERS": "2", "BOX_RESEND_S": "1", "BOX_STUCK_S": "2"}
    with running_box(tmp_path, **env) as procs:
        leader = procs["worker"].pid
        for round_ in range(3):
            # Every idle process of the pool, the worker blocked in the queue's read (holding its lock) among them.
            pool = wait_for(lambda: len(_pool(leader)) >= 4 and _pool(leader), timeout=60, what="the cluster's pool to be up")
            for pid in pool:
                _signal(pid, signal.SIGKILL)
            task = box.create(title=f"after killed workers {round_}", flow=QUICK)
            assert box.wait_state(task["id"], "done", "failed", timeout=60)["state"] == "done"
        # A frozen pool: every process below the leader stopped; runs wait, nothing claims them.
        for pid in _children(leader):
            _signal(pid, signal.SIGSTOP)
        stranded = [box.create(title=f"while frozen {n}", flow=QUICK)["id"] for n in range(3)]
        for task_id in stranded:
            assert box.wait_state(task_id, "done", "failed", timeout=60)["state"] == "done"
        assert procs["worker"].poll() is None  # the same leader, with a new cluster below it
    log = (tmp_path / "qcluster.log").read_text()
    assert "while the worker cluster claimed none; restarting it" in log

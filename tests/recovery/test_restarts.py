"""Queued work survives whatever happens to the queue: a crashed cluster, a lost message."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from django_q.brokers import get_broker

from boxsite.core import procs
from tasks.models import Run, RunState, Task
from tasks.run.reaper import resume_after_restart
from tests.cluster import MANAGE, running_box, spawn, stop
from tests.conftest import database_env, queue_through_the_cluster, wait_for
from tests.factories import flow

pytestmark = pytest.mark.usefixtures("cluster_mode")

QUICK = flow({"run": "echo quick"})


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)


def _crash(procs) -> None:
    """What a power cut does to the box's processes: SIGKILL, no goodbyes."""
    for proc in procs.values():
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_queued_tasks_run_after_the_cluster_crashed_with_their_messages(box, tmp_path):
    with running_box(tmp_path, BOX_WORKERS="1") as procs:
        busy = box.create(title="holds the only worker", flow=flow({"run": "sleep 30"}))
        wait_for(lambda: Task.objects.get(pk=busy["id"]).step, timeout=60, what="the long task to be mid-step")
        queued = [box.create(title=f"waits {n}", flow=QUICK)["id"] for n in range(4)]
        # The cluster has read (prefetched or locked) the waiting messages by now, or will have
        # lost them by crashing: either way only the box's own record knows they exist.
        _crash(procs)
    assert Task.objects.filter(pk__in=queued, state="queued").count() == 4
    with running_box(tmp_path, BOX_WORKERS="1"):
        for task_id in queued:
            assert box.wait_state(task_id, "done", "failed", timeout=60)["state"] == "done"
        assert box.wait_state(busy["id"], "done", "failed", timeout=60)["state"] == "done"


def test_a_run_whose_message_was_lost_is_sent_again_within_the_bound(box, tmp_path):
    env = {**database_env(), "BOX_SCHEDULER_TICK_SECONDS": "0.2", "BOX_RESEND_S": "1",
           "BOX_QUEUE_NAME": str(settings.Q_CLUSTER["name"])}
    scheduler = spawn([sys.executable, MANAGE, "runscheduler"], env, tmp_path / "scheduler.log")
    try:
        # A probe: a run waiting to be sent is sent by a scheduler that is past its start-up.
        probe = box.create(title="probe", flow=QUICK)
        Run.objects.filter(task_id=probe["id"]).update(enqueued_at=None)
        wait_for(lambda: Run.objects.get(task_id=probe["id"]).enqueued_at, timeout=60, what="the scheduler to tick")
        task = box.create(title="lost message", flow=QUICK)
        assert Run.objects.get(task_id=task["id"]).enqueued_at is not None
        get_broker().purge_queue()  # both messages are gone; only the run rows remember
        with running_box(tmp_path, scheduler=False):
            for task_id in (probe["id"], task["id"]):
                assert box.wait_state(task_id, "done", "failed", timeout=60)["state"] == "done"
        assert Run.objects.filter(task_id=task["id"]).count() == 1  # the same run, sent again
    finally:
        stop(scheduler)


def test_a_run_whose_worker_is_a_zombie_is_resumed_at_the_restart_not_left_to_its_lease(box):
    """A worker that died but was not yet waited for by its parent is a zombie: it does no work,
    yet ``kill(pid, 0)`` says it exists, and the restart left its run "running" for a lease."""
    task = box.create(title="cut off", flow=QUICK)
    zombie = subprocess.Popen(["true"])
    try:
        wait_for(lambda: procs.state(zombie.pid) == "Z", timeout=30, what="the child to exit unreaped")
        now = timezone.now()
        Run.objects.filter(task_id=task["id"]).update(
            state=RunState.RUNNING, lease_token="t" * 32, lease_expires_at=now + timedelta(minutes=5),
            started_at=now - timedelta(seconds=1), worker_host=socket.gethostname()[:255], worker_pid=zombie.pid)
        Task.objects.filter(pk=task["id"]).update(state="running")

        assert resume_after_restart(started_before=now) == 1
    finally:
        zombie.wait()
    runs = list(Run.objects.filter(task_id=task["id"]).order_by("number"))
    assert runs[0].state == RunState.LOST and len(runs) == 2, [(r.number, r.state) for r in runs]
    assert "the box restarted" in box.events(task["id"])[-1]["summary"]

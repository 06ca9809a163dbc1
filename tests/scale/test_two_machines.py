"""Two worker machines sharing one database and queue (docs/internals/scaling.md).

Each "machine" is a worker cluster with a data directory of its own for what belongs to one
machine (``BOX_LOCAL_DIR``: views, sandbox runtime, mounts, its pool of task users) and the
shared data directory for layers, workspaces and keys. One scheduler reaps leases for both.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings

from boxsite.core import procs
from tasks.models import Run, RunState, Task
from tasks.run import lifecycle
from tests.cluster import MANAGE, spawn, stop
from tests.conftest import Box, database_env, queue_through_the_cluster, wait_for
from tests.factories import flow

# 1 worker per machine, short leases: a dead machine's run is taken over within seconds.
MACHINE_ENV = {"BOX_LEASE_SECONDS": "3", "BOX_HEARTBEAT_SECONDS": "0.5", "BOX_RETRY_BACKOFF_SECONDS": "0.2",
               "BOX_SCHEDULER_TICK_SECONDS": "0.2", "BOX_QUEUE_POLL_S": "0.05", "BOX_WORKERS": "1",
               "BOX_USER_POOL": "2"}


def _descendants(pid: int) -> set[int]:
    return {pid, *procs.descendants(pid)}


@contextmanager
def machines(tmp_path: Path, names: list[str]) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    base = {**database_env(), **MACHINE_ENV, "BOX_QUEUE_NAME": str(django_settings.Q_CLUSTER["name"])}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    local = {name: tmp_path / name for name in names}
    try:
        for name in names:
            local[name].mkdir()
            procs[name] = spawn([sys.executable, MANAGE, "runcluster"], {**base, "BOX_LOCAL_DIR": str(local[name])},
                                tmp_path / f"{name}.log")
        procs["scheduler"] = spawn([sys.executable, MANAGE, "runscheduler"],
                                   {**base, "BOX_LOCAL_DIR": str(tmp_path / "scheduler")}, tmp_path / "scheduler.log")
        yield procs
    finally:
        for proc in procs.values():
            stop(proc)
        lifecycle.janitor.drain()
        for directory in [*local.values(), tmp_path / "scheduler"]:
            _release_machine(directory)


def _release_machine(directory: Path) -> None:
    """What a machine's supervisor does when it stops: nothing of its tasks stays on the host."""
    saved = django_settings.BOX_LOCAL_DIR
    django_settings.BOX_LOCAL_DIR = directory
    try:
        lifecycle.release_host()
    finally:
        django_settings.BOX_LOCAL_DIR = saved


def _runs_of(task_ids: list[str]) -> list[Any]:
    return list(Run.objects.filter(task_id__in=task_ids).values("task_id", "state", "worker_pid"))


def test_two_machines_run_every_task_once_share_the_work_and_take_over_a_dead_machines_run(
        box: Box, settings: Any, tmp_path: Path) -> None:
    queue_through_the_cluster(settings)
    with machines(tmp_path, ["a", "b"]) as procs:
        ids = [box.create(title=f"t{i}", flow=flow({"run": "sleep 0.3; echo ran"}))["id"] for i in range(12)]
        for task_id in ids:
            assert box.wait_state(task_id, "done", "failed", timeout=120)["state"] == "done"
        pids = {name: _descendants(procs[name].pid) for name in ("a", "b")}
        runs = _runs_of(ids)
        # Exactly once: one run per task, and its one step started and finished once.
        assert len(runs) == len(ids) and all(run["state"] == RunState.FINISHED for run in runs), runs
        for task_id in ids:
            kinds = [e["kind"] for e in box.events(task_id)]
            assert kinds.count("step") == 1 and kinds.count("step_result") == 1, kinds
        # Both machines worked.
        by_machine = {name: sum(run["worker_pid"] in pids[name] for run in runs) for name in pids}
        assert sum(by_machine.values()) == len(ids), (by_machine, runs)
        assert all(count > 0 for count in by_machine.values()), by_machine

        # One machine dies mid-run: its run is taken over by the other once the lease expires.
        task = box.create(title="long", flow=flow({"run": "sleep 4; echo finished"}))
        running = wait_for(lambda: Run.objects.filter(task_id=task["id"], state=RunState.RUNNING).first(),
                           timeout=60, what="the long task's run to start")
        dead = next(name for name in pids if running.worker_pid in _descendants(procs[name].pid))
        alive = "b" if dead == "a" else "a"
        os.killpg(procs[dead].pid, signal.SIGKILL)  # the machine, with every process it runs
        procs[dead].wait()
        assert box.wait_state(task["id"], "done", "failed", timeout=90)["state"] == "done"
        runs = list(Run.objects.filter(task_id=task["id"]).order_by("number"))
        assert runs[0].state == RunState.LOST and runs[-1].state == RunState.FINISHED, [(r.state, r.worker_pid) for r in runs]
        assert runs[-1].worker_pid in _descendants(procs[alive].pid)
        assert Task.objects.get(pk=task["id"]).state == "done"

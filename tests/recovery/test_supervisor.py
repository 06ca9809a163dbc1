"""The supervisor (``manage.py runbox``) stops cleanly in every task state and restarts a stuck cluster."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.test import override_settings

from boxsite.core import procs
from tasks.layers import mounts
from tasks.sandbox import accounts, users
from tests.conftest import wait_for
from tests.test_runbox import ROOT, _alive, _call, _children, _manage

FLOW_SLOW = {"steps": [{"run": "if [ -f .attempted ]; then echo again; else touch .attempted; sleep 30; fi", "name": "slow"},
                       {"write": {"path": "after.txt", "content": "ok"}}]}
FLOW_QUICK = {"steps": [{"write": {"path": "a.txt", "content": "a"}}, {"run": "cat a.txt"}]}
FLOW_ASKS = {"steps": [{"ask": "colour"}, {"run": "true"}]}


class RunningBox:
    def __init__(self, env: dict[str, str], token: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.env, self.token, self.proc, self.log = env, token, proc, log

    def call(self, method: str, path: str, body: object = None) -> dict:
        return _call(self.env["BOX_PORT"], self.token, method, path, body)

    def create(self, title: str, flow: dict) -> str:
        return str(self.call("POST", "/api/tasks", {"title": title, "flow": flow})["id"])

    def state(self, task_id: str) -> str:
        return str(self.call("GET", f"/api/tasks/{task_id}")["state"])

    def wait_state(self, task_id: str, *states: str, timeout: float = 60) -> str:
        return wait_for(lambda: (s := self.state(task_id)) in states and s, timeout=timeout,
                        what=f"task {task_id} to be {'/'.join(states)}")

    def events(self, task_id: str) -> list[dict]:
        return list(self.call("GET", f"/api/tasks/{task_id}/events?limit=1000")["events"])


def _setup(env: dict[str, str]) -> str:
    _manage(env, "migrate", "--no-input")
    _manage(env, "createowner", "me", extra={"BOX_OWNER_PASSWORD": "a-long-password"})
    return _manage(env, "createtoken", "--name", "test").strip().splitlines()[-1]


@contextmanager
def runbox(env: dict[str, str], token: str, log: Path) -> Iterator[RunningBox]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runbox"], env=env, cwd=ROOT,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    box = RunningBox(env, token, proc, log)

    def up() -> bool:
        try:
            return bool(box.call("GET", "/api/health")["ok"])
        except (urllib.error.URLError, ConnectionError):
            return False

    try:
        wait_for(up, timeout=60, what="the box to answer")
        yield box
    finally:
        leftovers = _alive(_children(proc.pid))
        if proc.poll() is None:  # a test that did not stop the box: Ctrl-C, as its owner would
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in _alive(leftovers):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # a box killed, not stopped, leaves its spare disk images mounted (its next start drops
        # them) and its spare task users (the box_env fixture removes them)
        mounts.unmount_all_under(Path(env["BOX_DATA_DIR"]) / "layers" / ".disk-spares")


def _stop(box: RunningBox) -> float:
    """Ctrl-C the supervisor; how long it took to exit."""
    family = _children(box.proc.pid)
    started = time.monotonic()
    box.proc.send_signal(signal.SIGINT)
    assert box.proc.wait(timeout=60) == 0
    took = time.monotonic() - started
    wait_for(lambda: not _alive(family), timeout=10, what="every process of the box to exit")
    return took


def _leftovers(env: dict[str, str], task_ids: list[str]) -> list[str]:
    """What a stopped box left on the host: task users (and their processes), mounts in its data dir."""
    found = [f"user {ident.name} with processes {accounts.processes_of(ident.uid)}"
             for ident in users.pool_users(env["BOX_DATA_DIR"])]  # its task users, free or held
    data_dir = env["BOX_DATA_DIR"]
    found += [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if data_dir in line]
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="task users and mounts need root")
def test_ctrl_c_in_every_task_state_hands_back_leaves_nothing_and_every_task_goes_on(box_env, tmp_path):
    env = {**box_env, "BOX_WORKERS": "1", "BOX_LEASE_SECONDS": "5", "BOX_HEARTBEAT_SECONDS": "0.5",
           "BOX_SCHEDULER_TICK_SECONDS": "0.2", "BOX_RESEND_S": "1"}
    token = _setup(env)
    log = tmp_path / "runbox.log"
    with runbox(env, token, log) as box:
        waiting = box.create("waits for an answer", FLOW_ASKS)
        box.wait_state(waiting, "waiting")
        cancelled = box.create("cancelled", FLOW_ASKS)
        box.wait_state(cancelled, "waiting")
        box.call("POST", f"/api/tasks/{cancelled}/cancel")
        running = box.create("mid-step at the stop", FLOW_SLOW)
        wait_for(lambda: "slow" in box.call("GET", f"/api/tasks/{running}").get("step", ""), timeout=60,
                 what="the slow step to start")
        queued = box.create("queued behind it", FLOW_QUICK)
        assert box.state(queued) == "queued"
        took = _stop(box)
    assert took < 15, f"a stop with a running step took {took:.1f}s"
    tasks = [waiting, cancelled, running, queued]
    assert _leftovers(env, tasks) == []

    with runbox(env, token, log) as box:
        assert box.wait_state(running, "done", "failed") == "done"
        assert box.wait_state(queued, "done", "failed") == "done"
        assert box.state(waiting) == "waiting" and box.state(cancelled) == "cancelled"
        notes = [e for e in box.events(running) if e["kind"] == "note"]
        assert any(e["data"].get("handed_back") for e in notes), notes
        assert any(e["data"].get("interrupted") for e in notes), notes
        # A stop right after a task ended, while its worker's janitor is still releasing it:
        # holding the task's release lock keeps the janitor inside that window.
        just_done = box.create("ends right before the stop", FLOW_QUICK)
        with override_settings(BOX_DATA_DIR=Path(env["BOX_DATA_DIR"]), BOX_LOCAL_DIR=None), users.task_lock(just_done):
            box.wait_state(just_done, "done")
            assert [m for m in _leftovers(env, []) if just_done in m], "released before the stop: no window"
            leader = _cluster_leader(box.proc.pid)
            family = _children(box.proc.pid)
            box.proc.send_signal(signal.SIGINT)
            # The cluster's workers (the janitor among them) end; the leader's own release of the
            # task waits for the lock.
            wait_for(lambda: not _alive(_children(leader)), timeout=30, what="the cluster's workers to end")
        assert box.proc.wait(timeout=60) == 0
        wait_for(lambda: not _alive(family), timeout=10, what="every process of the box to exit")
    assert _leftovers(env, [*tasks, just_done]) == []


def _sentinel_children(leader: int) -> list[int]:
    """The cluster's processes below its sentinel: workers, pusher, monitor."""
    return sorted(_children(leader) - {leader})


def _cluster_leader(supervisor: int) -> int:
    """The supervisor's own runcluster child (its sentinel and workers, forked from it, carry the
    same command line one level further down)."""
    for pid in procs.children(supervisor):
        try:
            if b"runcluster" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return 0


def test_killed_idle_workers_and_a_frozen_cluster_never_strand_tasks(box_env, tmp_path):
    env = {**box_env, "BOX_WORKERS": "2", "BOX_SCHEDULER_TICK_SECONDS": "0.2", "BOX_RESEND_S": "1",
           "BOX_STUCK_S": "3"}
    token = _setup(env)
    with runbox(env, token, tmp_path / "runbox.log") as box:
        leader = wait_for(lambda: _cluster_leader(box.proc.pid), timeout=30, what="the cluster to start")
        wait_for(lambda: len(_sentinel_children(leader)) >= 4, timeout=30, what="the cluster's workers to start")
        for _ in range(3):  # kill the idle pool, again and again
            for pid in _sentinel_children(leader):
                if Path(f"/proc/{pid}/stat").exists() and _children(pid) == set():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # gone already (the cluster's watchdog may be restarting it)
            first = box.create("after killed workers", FLOW_QUICK)
            assert box.wait_state(first, "done", "failed", timeout=60) == "done"
        # A frozen cluster (every process stopped): runs wait, nothing claims them.
        for pid in _children(leader):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stranded = [box.create(f"while frozen {n}", FLOW_QUICK) for n in range(3)]
        for task_id in stranded:
            assert box.wait_state(task_id, "done", "failed", timeout=90) == "done"
        _stop(box)
    # The cluster's own watchdog restarted it (the supervisor steps in only for a wedged leader).
    assert "while the worker cluster claimed none; restarting it" in (tmp_path / "runbox.log").read_text()

"""The one run command: web + worker + scheduler come up together, run a task, and stop on Ctrl-C."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
from django.conf import settings

from boxsite.core import procs
from tasks.layers import mounts
from tests.conftest import empty_pool_of, free_port, track_data_dir, wait_for

ROOT = Path(settings.BASE_DIR)


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid``."""
    return set(procs.descendants(pid))


def python_start_s() -> float:
    """How long a fresh Python process that imports Django's ORM takes right now: the pace of
    this (shared, maybe loaded) machine, for bounds on how long a box process takes."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import django.db.models"], check=True)
    return time.monotonic() - began


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if procs.alive(pid)}


@pytest.fixture(params=["embedded", "postgres+redis"])
def box_env(request, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "BOX_TEST_DATABASE_NAME", "BOX_WEB_PROCESS")}
    env.update({"BOX_DATA_DIR": str(tmp_path / "data"), "BOX_PORT": str(free_port()), "BOX_HOST": "127.0.0.1",
                "BOX_QUEUE_NAME": f"runbox-{os.getpid()}-{request.param}", "BOX_QUEUE_POLL_S": "0.05"})
    track_data_dir(env["BOX_DATA_DIR"])
    database = None
    if request.param == "postgres+redis":
        if not settings.DB_IS_POSTGRES:
            pytest.skip("runs in the PostgreSQL pass of the suite")
        database = f"box_runbox_{os.getpid()}"
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {database}"], check=True)
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{database}"
        # The suite's Redis database; the box's queue name is its own, so nothing is flushed:
        # only that queue's keys are removed after.
        env["REDIS_URL"] = settings.REDIS_URL or "redis://127.0.0.1:6379/13"
    yield env
    empty_pool_of(env["BOX_DATA_DIR"])  # a box the test had to kill leaves its spare task users
    if database:
        subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"], check=False)
        client = redis.Redis.from_url(env["REDIS_URL"])
        for key in client.scan_iter(match=f"django_q:{env['BOX_QUEUE_NAME']}:*"):
            client.delete(key)
        client.close()


def _manage(env: dict[str, str], *args: str, extra: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env={**env, **(extra or {})}, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _call(port: str, token: str, method: str, path: str, body: object = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_runbox_serves_runs_a_task_and_stops_all_three_on_ctrl_c(box_env, tmp_path):
    _manage(box_env, "migrate", "--no-input")
    created = _manage(box_env, "createowner", "me", extra={"BOX_OWNER_PASSWORD": "a-long-password"})
    assert "created" in created
    token = _manage(box_env, "createtoken", "--name", "test").strip().splitlines()[-1]
    assert token.startswith("box_")
    log = (tmp_path / "runbox.log").open("w+")
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runbox"], env=box_env, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    port = box_env["BOX_PORT"]
    try:
        def up() -> bool:
            try:
                return _call(port, token, "GET", "/api/health")["ok"]
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for(up, timeout=60, what="the box to answer")
        log.seek(0)
        assert f"http://127.0.0.1:{port}/" in log.read()
        task = _call(port, token, "POST", "/api/tasks", {"title": "hello", "flow": {"steps": [{"write": {"path": "hello.txt", "content": "hi"}}, {"run": "cat hello.txt"}]}})
        wait_for(lambda: _call(port, token, "GET", f"/api/tasks/{task['id']}")["state"] == "done", timeout=60, what="the task to finish")
        data_dir = box_env["BOX_DATA_DIR"]

        def task_mounts() -> list[str]:  # the disk limit's spare images stay mounted while the box runs
            return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                    if data_dir in line and "/.disk-spares/" not in line]

        wait_for(lambda: not task_mounts(), timeout=30, what="the task's mounts to go")
        family = _children(proc.pid)
        assert len(family) >= 3  # web, worker (and its cluster processes), scheduler
        pace = python_start_s()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        wait_for(lambda: not _alive(family), timeout=30, what="every process of the box to exit")
        log.seek(0)
        said = log.read()
        assert "did not stop within" not in said  # nothing waited out a grace period and was killed
        took = float(re.search(r"The box stopped in ([0-9.]+)s", said)[1])  # the stop's own measure
        # An idle stop takes about a second on a quiet machine; a loaded one slows every process
        # down, so the bound grows with how long a bare Python process takes to start right now.
        assert took < 2.0 + 4 * pace, f"an idle stop took {took:.1f}s (a Python start takes {pace:.1f}s now)"
        assert data_dir not in Path("/proc/self/mountinfo").read_text()  # the spares too
    finally:
        leftovers = _alive(_children(proc.pid))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in leftovers:  # each child runs in its own session: kill them one by one
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_a_killed_supervisor_takes_web_worker_and_scheduler_with_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "BOX_TEST_DATABASE_NAME", "BOX_WEB_PROCESS")}
    env.update({"BOX_DATA_DIR": str(tmp_path / "data"), "BOX_PORT": str(free_port()), "BOX_QUEUE_NAME": f"runbox-kill-{os.getpid()}"})
    track_data_dir(env["BOX_DATA_DIR"])
    _manage(env, "migrate", "--no-input")
    said = tmp_path / "runbox.log"
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "runbox"], env=env, cwd=ROOT,
                            stdout=said.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    family: set[int] = set()
    try:
        wait_for(lambda: len(_children(proc.pid)) >= 3, timeout=60, what="web, worker and scheduler to start")
        # A box without an owner says the one-time code its setup page asks for.
        wait_for(lambda: re.search(r"setup code [A-Z0-9]{4}-[A-Z0-9]{4}-[A-Z0-9]{4}", said.read_text()),
                 timeout=30, what="the setup code on the console")
        family = _children(proc.pid)
        proc.kill()
        proc.wait()
        wait_for(lambda: not _alive(family), timeout=30, what="the orphaned processes to exit")
    finally:
        for pid in _alive(family):
            os.kill(pid, signal.SIGKILL)
        # a box killed, not stopped, leaves its spare disk images mounted and its spare task users
        # (its next start drops the images, its next stop the users)
        mounts.unmount_all_under(tmp_path / "data" / "layers" / ".disk-spares")
        empty_pool_of(env["BOX_DATA_DIR"])

"""A real django-q2 cluster and scheduler, as subprocesses sharing the test database."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from tests.conftest import database_env, empty_pool_of, track_data_dir

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process of the box in its own session, its output appended to ``log``."""
    for directory in (env.get("BOX_DATA_DIR"), env.get("BOX_LOCAL_DIR")):  # its task users are marked with it
        track_data_dir(directory)
    return subprocess.Popen(argv, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=settings.BASE_DIR)


def stop(proc: subprocess.Popen[bytes], *, grace: float = 15.0) -> None:
    """SIGTERM the process itself, as the supervisor does (a cluster leader stops its own
    processes in order and finishes their releases); SIGKILL what is left of its session after
    it exits, or after ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return spawn([sys.executable, MANAGE, *argv], env, log)


@contextmanager
def running_box(tmp_path: Path, *, scheduler: bool = True, **env_overrides: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Start ``qcluster`` (and the scheduler) against the test database; stop both after."""
    env = database_env()
    env.update({
        "BOX_LEASE_SECONDS": "3",
        "BOX_HEARTBEAT_SECONDS": "0.5",
        "BOX_RETRY_BACKOFF_SECONDS": "0.2",
        "BOX_SCHEDULER_TICK_SECONDS": "0.2",
        "BOX_QUEUE_POLL_S": "0.05",
        "BOX_WORKERS": "1",
        "BOX_QUEUE_NAME": str(settings.Q_CLUSTER["name"]),
    })
    env.update(env_overrides)
    procs = {"worker": _start(["runcluster"], env, tmp_path / "qcluster.log")}
    if scheduler:
        procs["scheduler"] = _start(["runscheduler"], env, tmp_path / "scheduler.log")
    try:
        yield procs
    finally:
        for proc in procs.values():
            stop(proc)
        # What the supervisor does after its children stopped: the pool's spare users go (also
        # one an account tool finished after its process was killed).
        empty_pool_of(env["BOX_DATA_DIR"], env.get("BOX_LOCAL_DIR"))

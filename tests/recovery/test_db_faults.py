"""Short database faults under running tasks retry their runs; no task fails because of them.

PostgreSQL: the worker's connections are terminated (``pg_terminate_backend``) again and again.
SQLite: the test holds the database's write lock longer than the workers' busy timeout.
"""
from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tasks.models import Run, Task
from tests.cluster import MANAGE, running_box, spawn, stop
from tests.conftest import database_env, queue_through_the_cluster, wait_for
from tests.factories import flow

pytestmark = pytest.mark.usefixtures("cluster_mode")

TASKS = 6
FAULTS = 6
STEPS = flow(*[{"run": "sleep 0.4"} for _ in range(4)])


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)


def _terminate_other_backends() -> int:
    """Every connection to the test database but this process's own, cut off."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        ours = cursor.fetchone()[0]
    name = connection.settings_dict["NAME"]
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as admin:
        rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
                             (name, ours)).fetchall()
    return len(rows)


def _hold_sqlite_write_lock(seconds: float) -> None:
    """Take the write lock and keep it past the workers' busy timeout."""
    held = sqlite3.connect(connection.settings_dict["NAME"], timeout=30, isolation_level=None)
    try:
        held.execute("BEGIN IMMEDIATE")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # the fault lasts this long, by design
            time.sleep(0.05)
        held.execute("ROLLBACK")
    finally:
        held.close()


def _all_final(task_ids: list[str]) -> bool:
    return not Task.objects.filter(pk__in=task_ids, state__in=["queued", "running", "waiting"]).exists()


def test_database_faults_under_running_tasks_fail_none_of_them(box, tmp_path):
    env = {"BOX_WORKERS": "2", "BOX_MAX_RUN_ATTEMPTS": "6", "BOX_SQLITE_BUSY_TIMEOUT_S": "0.3"}
    with running_box(tmp_path, **env):
        task_ids = [box.create(title=f"through faults {n}", flow=STEPS)["id"] for n in range(TASKS)]
        wait_for(lambda: Run.objects.filter(task_id__in=task_ids, state="running").exists(), timeout=60,
                 what="a run to be under way")
        faults = 0
        while faults < FAULTS and not _all_final(task_ids):
            if settings.DB_IS_POSTGRES:
                _terminate_other_backends()
            else:
                _hold_sqlite_write_lock(0.8)
            faults += 1
            wait_for(lambda: Run.objects.filter(task_id__in=task_ids, state="running").exists() or _all_final(task_ids),
                     timeout=60, what="work to go on after the fault")
        wait_for(lambda: _all_final(task_ids), timeout=180, what="every task to end")
    assert faults >= 2
    states = dict(Task.objects.filter(pk__in=task_ids).values_list("pk", "state"))
    errors = dict(Task.objects.filter(pk__in=task_ids).values_list("pk", "error"))
    assert list(states.values()) == ["done"] * TASKS, errors


@contextmanager
def _runs_table_locked() -> Iterator[dict[str, str]]:
    """Nobody else may write the run table (PostgreSQL: nor read it) while this is open. Yields
    the environment that makes a box process give up on the lock quickly instead of waiting."""
    if settings.DB_IS_POSTGRES:
        name = connection.settings_dict["NAME"]
        with psycopg.connect(host="127.0.0.1", user="postgres", dbname=name) as locker:
            locker.execute("LOCK TABLE tasks_run IN ACCESS EXCLUSIVE MODE")
            yield {"PGOPTIONS": "-c lock_timeout=300"}
            locker.rollback()
    else:
        held = sqlite3.connect(connection.settings_dict["NAME"], timeout=30, isolation_level=None)
        try:
            held.execute("BEGIN IMMEDIATE")
            yield {"BOX_SQLITE_BUSY_TIMEOUT_S": "0.3"}
            held.execute("ROLLBACK")
        finally:
            held.close()


def test_a_database_fault_while_the_scheduler_starts_does_not_stop_it(box, tmp_path):
    """The scheduler is the only process that sends retries after their backoff: if a fault at
    its start could end it, every later handed-back run would wait for ever."""
    task = box.create(title="sent, never claimed", flow=STEPS)
    sent = Run.objects.get(task_id=task["id"]).enqueued_at
    assert sent is not None
    env = {**database_env(), "BOX_SCHEDULER_TICK_SECONDS": "0.2", "BOX_QUEUE_NAME": str(settings.Q_CLUSTER["name"])}
    log = tmp_path / "scheduler.log"
    with _runs_table_locked() as give_up_fast:
        scheduler = spawn([sys.executable, MANAGE, "runscheduler"], {**env, **give_up_fast}, log)
        try:
            # Its start-up re-send (a write to the run table) meets the fault.
            wait_for(lambda: "phase 're-send unclaimed runs' failed" in log.read_text() or scheduler.poll() is not None,
                     timeout=60, what="the scheduler's start-up to meet the fault")
        except BaseException:
            stop(scheduler)
            raise
    try:
        # The fault is over: the same process re-sends the run (its start-up, tried again).
        wait_for(lambda: scheduler.poll() is not None or Run.objects.get(task_id=task["id"]).enqueued_at != sent,
                 timeout=60, what="the scheduler to re-send the run after the fault")
        assert scheduler.poll() is None, log.read_text()[-3000:]
    finally:
        stop(scheduler)

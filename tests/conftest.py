"""Shared fixtures. Tests go through the front door: the API, real processes, real databases."""
from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection, connections
from django.dispatch import receiver
from django.test.signals import setting_changed
from django.test.utils import override_settings
from django_q.conf import Conf
from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from tasks import sandbox
from tasks.layers import disk, mounts, unmount_views
from tasks.layers import paths as layer_paths
from tasks.models import Task, Workspace
from tasks.run import lifecycle
from tasks.sandbox import accounts, users
from tests.factories import make_owner
from tests.schema_check import responses_match_the_schema  # noqa: F401 - autouse, the whole suite


def free_port() -> int:
    """A TCP port on 127.0.0.1 no one listens on now (for a process a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# Every data directory (and machine-local directory) this test worker gave a box, in this
# process or a subprocess, with the test that first used it. A box's pool of task users is marked
# with a digest of its directory (tasks.sandbox.users), which cannot be turned back into the
# directory: the session keeps the list to find the users its boxes left behind.
_data_dirs: dict[str, str] = {}


def track_data_dir(path: str | Path | None) -> None:
    """Call for a data directory a box started by a test uses (``database_env`` and
    ``tests.cluster.spawn`` do, and so does a test's change of the setting)."""
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "the session's set-up").rsplit(" (", 1)[0]
        _data_dirs.setdefault(str(Path(path).resolve()), test)


@receiver(setting_changed)
def _track_changed_data_dir(setting: str, value: Any, **kwargs: Any) -> None:
    if setting in ("BOX_DATA_DIR", "BOX_LOCAL_DIR"):
        track_data_dir(value)


def empty_pool_of(data_dir: str | Path, local_dir: str | Path | None = None) -> None:
    """What a box's stop does with its spare task users, for a box a test killed (or ran without
    the supervisor that empties the pool: a bare ``runcluster``, ``runscheduler``)."""
    with override_settings(BOX_DATA_DIR=Path(data_dir), BOX_LOCAL_DIR=Path(local_dir) if local_dir else None):
        lifecycle.empty_spare_pool()


def users_left_behind() -> dict[str, list[str]]:
    """Task users (free or claimed), and groups of pool users that are gone, of a data directory
    this test worker used, by the test that first used it. Once the session's boxes are stopped
    there must be none: nothing else removes those of a temporary data directory, which is gone
    by then. Those of a directory that is gone are removed here (nobody can use them); the others
    only reported."""
    left: dict[str, list[str]] = {}
    for directory, test in _data_dirs.items():
        found = users.pool_users(directory)
        groups = users.userless_groups(directory)  # also a claimed one: no box runs now
        if not found and not groups:
            continue
        gone = not Path(directory).exists()
        left[f"{directory} ({'gone; ' if gone else ''}first used by {test})"] = (
            [ident.name for ident in found] + [f"group {name}" for name in groups])
        if gone:
            for ident in found:
                accounts.remove_user(ident.name)
            for name in groups:
                accounts.remove_user(name)  # no user of that name: only its group goes
    return left


@pytest.fixture(autouse=True, scope="session")
def _worker_data_dir(worker_id: str) -> Iterator[None]:
    """Each test worker is a box of its own, with its own data directory: start-up reconcile
    releases the users and mounts of tasks its database does not know, so two workers (two test
    databases) must never share one. Session-scoped, so module-scoped clusters see it too (they
    share its vault key and sockets). At the end, no task user of any data directory the worker
    used may be left."""
    settings.BOX_DATA_DIR = Path(settings.BOX_DATA_DIR) / f"box-{worker_id}"
    settings.BOX_DATA_DIR.mkdir(parents=True, exist_ok=True)
    track_data_dir(settings.BOX_DATA_DIR)
    yield
    if sandbox.available():
        lifecycle.janitor.drain()
        lifecycle.empty_spare_pool()
        disk.drop_spares()  # the pool's free task users (claimed ones are released by each test)
        # A box process a test killed while it probed left its probe's mount: the next probe of
        # a box process removes it (``paths.probe_dir``), as here.
        for kind in ("probe", "disk-probe"):
            layer_paths.probe_dir(settings.BOX_DATA_DIR, kind)
        mounted = mounts.mounts_under(settings.BOX_DATA_DIR)
        assert not mounted, f"the tests left mounts in their data directory behind: {mounted}"
    left = users_left_behind()
    assert not left, f"the tests left task users (or their groups) of their boxes behind: {left}"


# A model call tried again waits this long at first: a test of retries must not wait a second.
MODEL_RETRY_BASE_S = 0.02


@pytest.fixture(autouse=True, scope="session")
def _fast_model_retries() -> None:
    settings.BOX_MODEL_RETRY_BASE_S = MODEL_RETRY_BASE_S


@pytest.fixture(autouse=True, scope="session")
def _worker_queue(worker_id: str) -> Iterator[None]:
    """Each test worker's queue has a name of its own. With REDIS_URL, test workers (and suites
    run side by side) share a Redis database: a cluster must never take another's runs. Nothing
    is flushed; the queue's own keys are removed at the end."""
    name = f"box-test-{worker_id}-{os.getpid()}"
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "name": name}
    # django-q2 read the name once, at import (it also salts the jobs' signatures).
    Conf.PREFIX = Conf.CLUSTER_NAME = name
    Conf.Q_STAT = f"django_q:{name}:cluster"
    yield
    if settings.REDIS_URL:
        client = redis.Redis.from_url(settings.REDIS_URL)
        for key in client.scan_iter(match=f"django_q:{name}:*"):
            client.delete(key)
        client.close()


@pytest.fixture(autouse=True)
def _database_sessions_name_their_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every PostgreSQL session opened during a test, by this process (any of its threads) or a
    box it starts, names the test (libpq's ``PGAPPNAME``; PostgreSQL keeps 63 characters): the
    session-end check below says which test left one open."""
    if settings.DB_IS_POSTGRES:
        monkeypatch.setenv("PGAPPNAME", request.node.name[:63])


@pytest.fixture
async def stream_connections_closed() -> Any:
    """An async test's database reads (``database_sync_to_async``) keep a connection open in
    asgiref's thread; closed after the test, passed or failed, so the test database can be
    flushed and dropped."""
    yield
    await database_sync_to_async(connections.close_all)()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's, and before it drops the test database: no other session may still be on
    it (a thread or a process a test left holding a connection). PostgreSQL refuses to drop a
    database in use, which pytest-django reports as a warning naming no culprit; this one names
    the test."""
    yield
    if not settings.DB_IS_POSTGRES:
        return
    query = ("SELECT pid, application_name, state, left(query, 120) FROM pg_stat_activity"
             " WHERE datname = current_database() AND pid <> pg_backend_pid()")
    with django_db_blocker.unblock():
        deadline = time.monotonic() + 5  # a process just stopped may still be closing its own
        while True:
            with connection.cursor() as cursor:
                cursor.execute(query)
                others = cursor.fetchall()
            if not others or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        connection.close()
    if others:  # reported, not failed: the drop's own failure is only a warning too
        warnings.warn(pytest.PytestWarning("sessions left open on the test database (pid, the test that opened "
                                           f"it, state, last query): {others}"), stacklevel=1)


@receiver(setting_changed)
def _queue_follows_q_cluster(setting: str, value: Any, **kwargs: Any) -> None:
    # django-q2 reads Q_CLUSTER once, at import; tests change it per test.
    if setting == "Q_CLUSTER":
        Conf.SYNC = bool((value or {}).get("sync", False))


@pytest.fixture(autouse=True)
def _box_settings(settings: Any) -> None:
    # django-q2's own sync mode: a run enqueued after commit executes right there, in the test's
    # process, through the same execute_run a qcluster would call.
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}
    # No pool of spare task users: many tests give each test a data directory of its own, whose
    # pool would outlive it. The sandbox tests (tests/sandbox/conftest.py) turn the pool on.
    settings.BOX_USER_POOL = 0


def queue_through_the_cluster(settings: Any) -> None:
    """Runs go onto the real queue (for a qcluster subprocess, or for nobody) instead of
    executing in the test. Call with pytest-django's ``settings`` fixture."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}


class Box:
    """The owner, a token-authenticated API client, and a ``home`` workspace in a temp dir."""

    def __init__(self, owner: Any, token: str, home: Path) -> None:
        self.owner = owner
        self.token = token
        self.home = home
        self.api = APIClient()
        self.api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def create(self, **spec: Any) -> dict[str, Any]:
        response = self.api.post("/api/tasks", spec, format="json")
        assert response.status_code == 201, response.json()
        return response.json()

    def task(self, task_id: str) -> dict[str, Any]:
        response = self.api.get(f"/api/tasks/{task_id}")
        assert response.status_code == 200, response.json()
        return response.json()

    def events(self, task_id: str, after: int = 0) -> list[dict[str, Any]]:
        response = self.api.get(f"/api/tasks/{task_id}/events", {"after": after, "limit": 1000})
        assert response.status_code == 200, response.json()
        return response.json()["events"]

    def wait_state(self, task_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            view = self.task(task_id)
            return view if view["state"] in states else None

        return wait_for(reached, timeout=timeout, what=f"task {task_id} to be {'/'.join(states)}")


def owner_with_home(tmp_path: Path, token_name: str) -> tuple[Any, str, Path]:
    """An owner, their API token (with the folder right) and a ``home`` workspace in ``tmp_path``."""
    home = tmp_path / "home"
    home.mkdir()
    Workspace.objects.update_or_create(name="home", defaults={"base_dir": str(home)})
    owner = make_owner()
    _, raw = issue_api_token(owner, token_name, can_use_folders=True)
    return owner, raw, home


@pytest.fixture
def box(transactional_db: Any, tmp_path: Path) -> Iterator[Box]:
    yield Box(*owner_with_home(tmp_path, "tests"))
    # a task the test left queued/running/waiting keeps its overlay mounted; its rows are flushed next
    task_ids = list(Task.objects.values_list("pk", flat=True))
    # Releases still running in this process's background thread. One that ran on past the test
    # acts on the settings restored under it (a layer test's data directory removed, the pool back
    # at its default): it makes users/ and locks/ there again, and may keep a pool user of it.
    assert lifecycle.janitor.drain(timeout=120), "the janitor's releases did not finish within 120 s"
    for task_id in task_ids:  # ... and its Linux user (and processes): system uids are few
        sandbox.release(task_id)
    unmount_views(task_ids)
    disk.drop_spares()  # kept mounted while a box runs; its stop drops them


def database_env() -> dict[str, str]:
    """Environment for a subprocess (a real qcluster, the scheduler) that must share the test DB."""

    # Importing boxsite.asgi (the stream tests do) marks this process as the web process, whose
    # PostgreSQL connections come from a pool; a forking worker cluster must never inherit that.
    env = {key: value for key, value in os.environ.items() if key != "BOX_WEB_PROCESS"}
    name = connection.settings_dict["NAME"]
    if settings.DB_IS_POSTGRES:
        env["BOX_DATABASE_NAME"] = str(name)
    else:
        env["BOX_SQLITE_PATH"] = str(name)
    env["BOX_DATA_DIR"] = str(settings.BOX_DATA_DIR)
    track_data_dir(settings.BOX_DATA_DIR)
    env["BOX_USER_POOL"] = str(settings.BOX_USER_POOL)
    env["BOX_QUEUE_NAME"] = str(settings.Q_CLUSTER["name"])  # this test worker's own queue
    # Queued jobs are signed with this process's key, which came from the original data dir.
    env["DJANGO_SECRET_KEY"] = settings.SECRET_KEY
    env["BOX_MODEL_RETRY_BASE_S"] = str(settings.BOX_MODEL_RETRY_BASE_S)
    return env


@pytest.fixture
def cluster_env() -> Iterator[dict[str, str]]:
    yield database_env()

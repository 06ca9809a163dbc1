"""A real box for tests that speak to it as an outside program does (the MCP SDK's client, the
API guide's example): daphne serving the ASGI application and a django-q2 cluster executing
runs, on the test database."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tasks.run import lifecycle
from tests.cluster import spawn, stop
from tests.conftest import database_env, free_port, owner_with_home, wait_for


class LiveBox:
    def __init__(self, url: str, owner: Any, token: str, home: Path, procs: list[subprocess.Popen[bytes]],
                 start_worker: Callable[[], subprocess.Popen[bytes]]) -> None:
        self.url = url
        self.mcp = f"{url}/mcp"
        self.owner = owner
        self.token = token
        self.home = home
        self._procs = procs
        self._start_worker = start_worker

    def stop_worker(self) -> None:
        """Stop the cluster as the supervisor does; what is sent meanwhile waits in the queue."""
        stop(self._procs.pop(), grace=15)

    def start_worker(self) -> None:
        self._procs.append(self._start_worker())


@pytest.fixture
def live_box(transactional_db: Any, tmp_path: Path) -> Iterator[LiveBox]:
    """The web process and a worker, as `runbox` starts them, and the owner's API token."""
    owner, token, home = owner_with_home(tmp_path, "mcp tests")
    port = free_port()
    env = database_env()
    env.update({"BOX_QUEUE_POLL_S": "0.05", "BOX_WORKERS": "1", "BOX_LIVE_POLL_SECONDS": "0.1",
                "BOX_QUEUE_NAME": str(settings.Q_CLUSTER["name"]), "BOX_ALLOWED_HOSTS": "127.0.0.1,localhost"})
    manage = str(Path(settings.BASE_DIR) / "manage.py")

    def worker() -> subprocess.Popen[bytes]:
        return spawn([sys.executable, manage, "runcluster"], env, tmp_path / "cluster.log")

    procs = [
        spawn([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "boxsite.asgi:application"], env,
              tmp_path / "web.log"),
        worker(),
    ]
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    try:
        wait_for(up, timeout=30, what="the web process to answer")
        yield LiveBox(url, owner, token, home, procs, worker)
    finally:
        for proc in procs:
            stop(proc, grace=4)
        lifecycle.janitor.drain()
        lifecycle.release_host()

"""100 concurrent clients: no 5xx, and on PostgreSQL the box's connections stay within its bound."""
from __future__ import annotations

import threading
import urllib.error
import urllib.request

import psycopg

from tests.conftest import wait_for
from tests.recovery.test_supervisor import _setup, runbox

CLIENTS = 100
REQUESTS_EACH = 5
THREADS = 8
# The web process's threads and its live streams' one, plus what the other processes hold: two
# workers (a run and its heartbeat each), the cluster's own processes, the scheduler and the supervisor.
BOUND = THREADS + 1 + 10


def _connections(database: str) -> int:
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as admin:
        return int(admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)).fetchone()[0])


def test_a_hundred_concurrent_clients_get_no_5xx_within_the_connection_bound(box_env, tmp_path):
    env = {**box_env, "BOX_WEB_THREADS": str(THREADS), "BOX_WORKERS": "2"}
    token = _setup(env)
    database = env.get("DATABASE_URL", "").rsplit("/", 1)[-1] if "DATABASE_URL" in env else None
    statuses: list[int] = []
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _connections(database or ""))
            done.wait(0.05)

    with runbox(env, token, tmp_path / "runbox.log") as box:
        task_id = box.create("something to read", {"steps": [{"run": "true"}]})
        box.wait_state(task_id, "done")
        port = env["BOX_PORT"]
        start = threading.Barrier(CLIENTS)

        def client(n: int) -> None:
            start.wait()
            for i in range(REQUESTS_EACH):
                path = "/api/tasks" if (n + i) % 2 else f"/api/tasks/{task_id}"
                request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=120) as response:
                        statuses.append(response.status)
                except urllib.error.HTTPError as exc:
                    statuses.append(exc.code)

        watcher = threading.Thread(target=watch, daemon=True) if database else None
        if watcher:
            watcher.start()
        clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(timeout=300)
        done.set()
        if watcher:
            watcher.join()
        wait_for(lambda: len(statuses) == CLIENTS * REQUESTS_EACH, timeout=10, what="every answer")
    assert {code for code in statuses} == {200}, {code: statuses.count(code) for code in set(statuses)}
    if database:
        assert 0 < peak[0] <= BOUND, f"{peak[0]} connections to the database, bound {BOUND}"

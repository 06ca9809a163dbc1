"""A throwaway box for benchmarks: its own data dir (and database), web + worker + scheduler."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchBox:
    def __init__(self, *, postgres: bool = False, redis: bool = False, workers: int = 2, extra_env: dict[str, str] | None = None) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="box-bench-"))
        self.port = free_port()
        self.env = dict(os.environ)
        self.env.update({"BOX_DATA_DIR": str(self.data), "BOX_PORT": str(self.port), "BOX_WORKERS": str(workers),
                         "BOX_QUEUE_NAME": f"bench-{os.getpid()}", "BOX_QUEUE_POLL_S": "0.05", "BOX_LOG_LEVEL": "WARNING"})
        for key in ("DATABASE_URL", "REDIS_URL"):
            self.env.pop(key, None)
        self.db_name = None
        if postgres:
            self.db_name = f"box_bench_{os.getpid()}"
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {self.db_name}"], check=True)
            self.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{self.db_name}"
        if redis:
            self.env["REDIS_URL"] = "redis://127.0.0.1:6379/7"
        self.env.update(extra_env or {})
        self.procs: list[subprocess.Popen[bytes]] = []
        self.token = ""

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run([PYTHON, str(ROOT / "manage.py"), *args], env={**self.env, **(env or {})}, check=True,
                             capture_output=True, text=True, cwd=ROOT)
        return out.stdout.strip()

    def start(self) -> BenchBox:
        self.manage("migrate", "--no-input")
        self.manage("createowner", "bench", env={"BOX_OWNER_PASSWORD": "bench-password"})
        self.token = self.manage("createtoken").splitlines()[-1]
        logs = (self.data / "box.log").open("ab")
        for argv in (["-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "boxsite.asgi:application"],
                     [str(ROOT / "manage.py"), "qcluster"], [str(ROOT / "manage.py"), "runscheduler"]):
            self.procs.append(subprocess.Popen([PYTHON, *argv], env=self.env, cwd=ROOT, stdout=logs, stderr=logs, start_new_session=True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.get("/api/health")
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("the bench box did not come up; see " + str(self.data / "box.log"))

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as response:
            return json.loads(response.read())

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        # A task that ended just before the stop may still hold its view: do what the box's
        # start-up reconcile would, so benchmarks leave no mounts behind.
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(self.data))), reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        if self.db_name:
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)"], check=False)
        if "REDIS_URL" in self.env:
            subprocess.run(["redis-cli", "-n", "7", "FLUSHDB"], check=False, capture_output=True)

    def __enter__(self) -> BenchBox:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]

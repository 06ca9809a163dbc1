"""A throwaway box for benchmarks: its own data dir (and database), web + worker + scheduler.

The box runs with its defaults (queue poll included), so its figures are what a default box gives.
Everything it makes goes when it stops, also when the bench is killed (SIGTERM, SIGHUP, Ctrl-C):
its processes, mounts, task users, data directory and PostgreSQL database. With Redis it uses the
database ``BOX_BENCH_REDIS_DB`` names (default 7), only if that database is empty when it starts,
and flushes only a database it found empty.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
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
if str(ROOT) not in sys.path:  # a bench imports the box's own helpers (boxsite.core.procs) after this module
    sys.path.append(str(ROOT))


def setup_django(data: Path, *, sandbox: str = "off", migrate: bool = True) -> None:
    """Django in this process, on a fresh data dir of its own (an SQLite database in it): for a
    bench that calls the box's code directly rather than through a running box."""
    os.environ.update({"BOX_DATA_DIR": str(data), "BOX_SQLITE_PATH": str(data / "bench.sqlite3"),
                       "BOX_SANDBOX": sandbox, "BOX_LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "boxsite.settings"})
    os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", "--no-input", verbosity=0)


def new_data_dir(prefix: str) -> Path:
    """A fresh data directory for a bench (a ``BenchBox``, or one set up by ``setup_django``): under /var/tmp (a real
    disk, where the box keeps its data), or under ``TMPDIR`` when that is set."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR") or "/var/tmp"))


def remove_data_dir(data: Path) -> None:
    """Remove a bench's data directory set up by ``setup_django``, with every mount left under it.
    The releases still running in this process's background janitor finish first: one that ran
    on after the removal would make parts of the directory again (its lock files)."""
    from tasks.layers import mounts
    from tasks.run import lifecycle  # the box's code imports only once ``setup_django`` configured Django

    lifecycle.janitor.drain()
    mounts.unmount_all_under(data)
    shutil.rmtree(data, ignore_errors=True)


def api_request(port: int, token: str, method: str, path: str, body: Any = None) -> Any:
    """One call to a bench box's API on ``port`` with ``token``: the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchBox:
    def __init__(self, *, postgres: bool = False, redis: bool = False, workers: int = 2, extra_env: dict[str, str] | None = None,
                 cluster: str = "qcluster") -> None:
        self.data = new_data_dir("box-bench-")  # where a box keeps its data: a real disk, not /tmp
        self.port = free_port()
        self.env = dict(os.environ)
        self.env.update({"BOX_DATA_DIR": str(self.data), "BOX_PORT": str(self.port), "BOX_WORKERS": str(workers),
                         "BOX_QUEUE_NAME": f"bench-{os.getpid()}", "BOX_LOG_LEVEL": "WARNING"})
        for key in ("DATABASE_URL", "REDIS_URL", "BOX_QUEUE_POLL_S"):
            self.env.pop(key, None)
        self.postgres = postgres
        self.redis = redis
        self.db_name: str | None = None
        self.redis_db: str | None = None  # set once this box owns (found empty) a Redis database
        self.env.update(extra_env or {})
        self.procs: list[subprocess.Popen[bytes]] = []
        self.token = ""
        self.cluster = cluster  # the worker command: django-q2's qcluster, or runcluster as runbox starts it

    def _claim_redis(self) -> None:
        number = os.environ.get("BOX_BENCH_REDIS_DB", "7")
        size = subprocess.run(["redis-cli", "-n", number, "DBSIZE"], check=True, capture_output=True, text=True).stdout.strip()
        if size != "0":
            raise RuntimeError(f"Redis database {number} holds {size} keys that are not this bench's; "
                               "set BOX_BENCH_REDIS_DB to an empty database")
        self.redis_db = number
        self.env["REDIS_URL"] = redis_url(number)

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run([PYTHON, str(ROOT / "manage.py"), *args], env={**self.env, **(env or {})}, check=True,
                             capture_output=True, text=True, cwd=ROOT)
        return out.stdout.strip()

    def start(self) -> BenchBox:
        if self.postgres:
            self.db_name = f"box_bench_{os.getpid()}"
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {self.db_name}"], check=True)
            self.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{self.db_name}"
        if self.redis:
            self._claim_redis()
        self.manage("migrate", "--no-input")
        self.manage("createowner", "bench", env={"BOX_OWNER_PASSWORD": "bench-password"})
        self.token = self.manage("createtoken").splitlines()[-1]
        logs = (self.data / "box.log").open("ab")
        profiles = os.environ.get("BOX_BENCH_PROFILE", "")
        for argv in (["-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "boxsite.asgi:application"],
                     [str(ROOT / "manage.py"), self.cluster], [str(ROOT / "manage.py"), "runscheduler"]):
            if profiles:  # bench/profiled.py runs the command: every thread of it profiled
                argv = [str(ROOT / "bench" / "profiled.py"), profiles, *argv]
            self.procs.append(subprocess.Popen([PYTHON, *argv], env=self.env, cwd=ROOT, stdout=logs, stderr=logs, start_new_session=True))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                self.get("/api/health")
                if profiles:
                    self.profile_reset()
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise RuntimeError("the bench box did not come up; see " + str(self.data / "box.log"))

    def profile_reset(self) -> None:
        """With ``BOX_BENCH_PROFILE``: clear the box's profiles (what ran so far is left out)."""
        reset = Path(os.environ["BOX_BENCH_PROFILE"]) / "reset"
        reset.parent.mkdir(parents=True, exist_ok=True)
        reset.write_text(str(time.time()))
        time.sleep(1.5)  # bench/profiled.py looks for it every second

    def request(self, method: str, path: str, body: Any = None) -> Any:
        return api_request(self.port, self.token, method, path, body)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def stop(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the clean-up short
            signal.signal(signum, signal.SIG_IGN)
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group, also after a clean exit
            except ProcessLookupError:
                pass
            proc.wait()
        if self.procs:
            # What runbox's stop does once its processes are gone (they were stopped, or killed
            # before they could): the tasks' users and mounts released, the pool's users deleted.
            subprocess.run([PYTHON, "-c", _RELEASE_HOST], env=self.env, cwd=ROOT, check=False, capture_output=True,
                           timeout=300)
        # A task that ended just before the stop may still hold its view: do what the box's
        # start-up reconcile would, so benchmarks leave no mounts behind.
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(self.data))), reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        self._remove_task_users()
        if self.db_name:
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)"], check=False)
        if self.redis_db is not None:
            subprocess.run(["redis-cli", "-n", self.redis_db, "FLUSHDB"], check=False, capture_output=True)
        shutil.rmtree(self.data, ignore_errors=True)

    def _remove_task_users(self) -> None:
        # Whatever the box's own release left (it could not start, say). The box marks each of its
        # task users with a digest of its data directory (tasks.sandbox.users).
        digest = hashlib.sha256(str(self.data.resolve()).encode()).hexdigest()[:16]
        for entry in pwd.getpwall():
            if entry.pw_name.startswith("box-") and entry.pw_gecos in (f"box task user {digest}", f"box pool user {digest}"):
                for tool in ("userdel", "groupdel"):
                    deadline = time.monotonic() + 30
                    # exit 10 (8): another process holds /etc/passwd's lock (a process of the user is still exiting)
                    while subprocess.run([tool, entry.pw_name], check=False, capture_output=True).returncode in (8, 10):
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.1)

    def __enter__(self) -> BenchBox:
        stop_on_signals()
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# Run with the bench box's environment, after its processes are gone.
_RELEASE_HOST = """
import django
django.setup()
from tasks.run import lifecycle
from tasks.sandbox import accounts, users
lifecycle.release_host()
for ident in [*users.pool_users(), *accounts.legacy_users()]:
    accounts.remove_user(ident.name)
"""


def redis_url(number: str | None = None) -> str:
    return f"redis://127.0.0.1:6379/{number if number is not None else os.environ.get('BOX_BENCH_REDIS_DB', '7')}"


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through every ``with BenchBox``, which cleans up


def stop_on_signals() -> None:
    """A bench killed by a timeout (SIGTERM/SIGHUP) still stops its box and removes what it made."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]

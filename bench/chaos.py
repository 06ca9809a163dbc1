"""Chaos: N tasks through K killed workers, a killed and restarted box, and database faults.

Runs a real box under its supervisor (`manage.py runbox`) for the embedded default and for
PostgreSQL + Redis. While N three-step tasks run it SIGKILLs K busy workers, on PostgreSQL
terminates the box's database connections T times (`pg_terminate_backend`, on the bench's own
database only), then SIGKILLs the whole box mid-work and starts it again. When every task has
ended (or the deadline passed) it stops the box with Ctrl-C and prints:

- lost: tasks still queued at the end (never run);
- stuck: tasks still running or waiting at the end;
- failed by faults: tasks that failed (none of these tasks can fail by itself);
- steps run twice: step completions beyond one per step (each step appends a line as it ends);
  of them, those whose first completion was recorded (a step result in the log, then the step
  ran again). A kill after a step's process exited does not run it again: the sandbox's init
  writes the step's receipt before it exits, and the retry records the result from it ("from
  receipt" counts those); a kill that lands between the step's last action and its process's
  exit is a step cut off mid-way, which runs again (the log marks it interrupted);
- leftovers: task users, their processes and mounts in the data dir after the stop.

All zero is the bar. Usage: .venv/bin/python bench/chaos.py [--tasks N] [--kills K] [--db-faults T]
(PostgreSQL + Redis: Redis database ``BOX_BENCH_REDIS_DB``, default 7, where only the bench's own
queue's keys are touched).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import PYTHON, ROOT, api_request, free_port  # noqa: E402

from boxsite.core import procs  # noqa: E402 - the repository's root is on the path once harness is imported

STEPS = 3
# Each step appends a line to a file of its task's own (the workspace's stack shows every
# earlier task's files to later tasks), as the last thing it does.
FLOW = {"steps": [{"run": f"sleep 1.{2 * i}; echo step{i} >> .effects-$BOX_TASK_ID", "name": f"step {i}"} for i in range(STEPS)]}
# The bench's queue has a name of its own in this database: nothing else in it is touched.
REDIS_DB = os.environ.get("BOX_BENCH_REDIS_DB", "7")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class ChaosBox:
    def __init__(self, postgres: bool) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="box-chaos-"))
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        self.env.update({
            "BOX_DATA_DIR": str(self.data), "BOX_PORT": str(self.port), "BOX_WORKERS": "2",
            "BOX_QUEUE_NAME": f"chaos-{os.getpid()}", "BOX_QUEUE_POLL_S": "0.05", "BOX_LOG_LEVEL": "WARNING",
            "BOX_LEASE_SECONDS": "5", "BOX_HEARTBEAT_SECONDS": "1", "BOX_RETRY_BACKOFF_SECONDS": "0.5",
            "BOX_MAX_RUN_ATTEMPTS": "6", "BOX_SCHEDULER_TICK_SECONDS": "0.5", "BOX_RESEND_S": "3", "BOX_STUCK_S": "6",
        })
        self.db_name = ""
        if postgres:
            self.db_name = f"box_chaos_{os.getpid()}"
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {self.db_name}"], check=True)
            self.env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{self.db_name}"
            self.env["REDIS_URL"] = f"redis://127.0.0.1:6379/{REDIS_DB}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run([PYTHON, str(ROOT / "manage.py"), *args], env={**self.env, **(env or {})}, check=True,
                             capture_output=True, text=True, cwd=ROOT)
        return out.stdout.strip()

    def setup(self) -> None:
        self.manage("migrate", "--no-input")
        self.manage("createowner", "chaos", env={"BOX_OWNER_PASSWORD": "chaos-password"})
        self.token = self.manage("createtoken").splitlines()[-1]

    def start(self) -> None:
        log = (self.data / "box.log").open("ab")
        self.proc = subprocess.Popen([PYTHON, str(ROOT / "manage.py"), "runbox"], env=self.env, cwd=ROOT,
                                     stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                self.request("GET", "/api/health")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        raise RuntimeError(f"the box did not come up; see {self.data / 'box.log'}")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        return api_request(self.port, self.token, method, path, body)

    def busy_workers(self) -> list[int]:
        """django-q2 worker processes that are running a task's processes right now."""
        assert self.proc is not None
        leader = next((p for p in procs.children(self.proc.pid) if b"runcluster" in _cmdline(p)), None)
        if leader is None:
            return []
        busy = []
        for pid in procs.descendants(leader):
            kids = set(procs.descendants(pid))
            running_a_task = any(b"setpriv" in _cmdline(k) or b"unshare" in _cmdline(k) for k in kids)
            is_worker = not any(b"runcluster" in _cmdline(k) for k in kids)  # not the sentinel above the workers
            if b"runcluster" in _cmdline(pid) and running_a_task and is_worker:
                busy.append(pid)
        return busy

    def crash(self) -> None:
        """SIGKILL the supervisor and every process below it at once, like a power cut."""
        assert self.proc is not None
        family = set(procs.descendants(self.proc.pid)) | {self.proc.pid}
        for pid in family:
            try:
                os.kill(pid, signal.SIGSTOP)  # freeze first, so nothing reacts to the others dying
            except ProcessLookupError:
                pass
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def stop(self) -> float:
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        return time.monotonic() - started

    def terminate_backends(self) -> int:
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-tAc",
                              f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{self.db_name}'"],
                             check=False, capture_output=True, text=True)
        return int(out.stdout.strip() or 0)

    def cleanup(self) -> None:
        if self.db_name:
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)"],
                           check=False, capture_output=True)
            client = redis.Redis.from_url(self.env["REDIS_URL"])
            for key in client.scan_iter(match=f"django_q:{self.env['BOX_QUEUE_NAME']}:*"):
                client.delete(key)
            client.close()
        if str(self.data) in Path("/proc/self/mountinfo").read_text():
            print(f"left {self.data} in place: something is still mounted in it")
        else:
            shutil.rmtree(self.data, ignore_errors=True)


def _states(box: ChaosBox, ids: list[str]) -> dict[str, str]:
    states = {}
    for task_id in ids:
        try:
            states[task_id] = box.request("GET", f"/api/tasks/{task_id}")["state"]
        except (urllib.error.URLError, ConnectionError):
            states[task_id] = "unknown"
    return states


def _step_completions(data: Path, task_id: str) -> int:
    """Lines in the task's own effects file (in its layer on disk); the largest copy found."""
    counts = [len(path.read_text().splitlines()) for path in data.rglob(f".effects-{task_id}")]
    return max(counts, default=0)


def _recorded_twice(box: ChaosBox, task_id: str) -> int:
    """Steps whose result is in the log more than once: a step that finished and was recorded,
    then ran again."""
    events = box.request("GET", f"/api/tasks/{task_id}/events?limit=1000")["events"]
    results = [e["data"].get("step") for e in events if e["kind"] == "step_result" and e["data"].get("ok")]
    return sum(results.count(step) - 1 for step in set(results))


def _from_receipt(box: ChaosBox, task_id: str) -> int:
    """Steps whose result a retry recorded from the receipt a lost run left (not run again)."""
    events = box.request("GET", f"/api/tasks/{task_id}/events?limit=1000")["events"]
    return sum(1 for e in events if e["kind"] == "step_result" and e["data"].get("fromReceipt"))


def _leftovers(box: ChaosBox) -> list[str]:
    """What the stopped box left on the host: its task users (with their processes), mounts in
    its data dir. The users are found by the box's own code (their comment names the box)."""
    found = box.manage("shell", "-c", "from tasks.sandbox import users\n"
                       "for i in users.pool_users(): print('user', i.name, 'processes', accounts.processes_of(i.uid))")
    leftovers = [line for line in found.splitlines() if line.startswith("user ")]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if str(box.data) in line:
            leftovers.append("mount " + line.split()[4])
    return leftovers


def run(postgres: bool, tasks: int, kills: int, db_faults: int, deadline_s: float) -> dict[str, Any]:
    box = ChaosBox(postgres)
    try:
        box.setup()
        box.start()
        box.request("PATCH", "/api/settings", {"maxActiveTasks": tasks + 10})
        ids = [box.request("POST", "/api/tasks", {"title": f"chaos {n}", "flow": FLOW})["id"] for n in range(tasks)]
        killed = terminated = 0
        rng = random.Random(17)
        crash_at = max(1, kills // 2)
        started = time.monotonic()
        load_start = os.getloadavg()[0]
        while killed < kills and time.monotonic() - started < deadline_s / 2:
            busy = box.busy_workers()
            if busy:
                os.kill(rng.choice(busy), signal.SIGKILL)
                killed += 1
                if postgres and terminated < db_faults:
                    terminated += 1 if box.terminate_backends() else 0
                if killed == crash_at:
                    box.crash()
                    box.start()
            time.sleep(rng.uniform(0.3, 1.0))
        while postgres and terminated < db_faults:
            terminated += 1 if box.terminate_backends() else 0
            time.sleep(0.5)
        end = time.monotonic() + deadline_s
        states = _states(box, ids)
        while time.monotonic() < end and any(s in ("queued", "running", "waiting") for s in states.values()):
            time.sleep(1)
            states = _states(box, ids)
        done = [t for t, s in states.items() if s == "done"]
        recorded_twice = sum(_recorded_twice(box, t) for t in done)
        from_receipt = sum(_from_receipt(box, t) for t in done)
        load_end = os.getloadavg()[0]
        stop_s = box.stop()
        twice = sum(max(0, _step_completions(box.data, t) - STEPS) for t in done)
        return {
            "tasks": tasks, "kills": killed, "db_faults": terminated, "crashes": 1,
            "done": sum(s == "done" for s in states.values()),
            "lost": sum(s == "queued" for s in states.values()),
            "stuck": sum(s in ("running", "waiting") for s in states.values()),
            "failed": sum(s == "failed" for s in states.values()),
            "twice": twice, "recorded_twice": recorded_twice, "from_receipt": from_receipt,
            "load": (load_start, load_end), "leftovers": _leftovers(box), "stop_s": stop_s,
            "elapsed_s": time.monotonic() - started,
        }
    finally:
        if box.proc is not None and box.proc.poll() is None:
            try:
                box.stop()  # a stop, not a crash: the box releases its task users and mounts
            except subprocess.TimeoutExpired:
                box.crash()
        box.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--db-faults", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--only", choices=["embedded", "postgres"], default=None)
    args = parser.parse_args()
    rows = []
    for label, pg in (("embedded (SQLite, ORM queue)", False), ("PostgreSQL + Redis", True)):
        if args.only and args.only != ("postgres" if pg else "embedded"):
            continue
        rows.append((label, run(pg, args.tasks, args.kills, args.db_faults, args.deadline)))
    print(f"\n{'configuration':30} {'tasks':>5} {'kills':>5} {'db':>3} {'done':>5} {'lost':>5} {'stuck':>5} "
          f"{'failed':>6} {'twice':>5} {'rec.twice':>9} {'receipt':>7} {'left':>5} {'stop s':>6} {'total s':>7} load")
    for label, r in rows:
        print(f"{label:30} {r['tasks']:5} {r['kills']:5} {r['db_faults']:3} {r['done']:5} {r['lost']:5} {r['stuck']:5} "
              f"{r['failed']:6} {r['twice']:5} {r['recorded_twice']:9} {r['from_receipt']:7} {len(r['leftovers']):5} "
              f"{r['stop_s']:6.1f} {r['elapsed_s']:7.0f} {r['load'][0]:.1f}-{r['load'][1]:.1f}")
    for label, r in rows:
        for leftover in r["leftovers"]:
            print(f"left by {label}: {leftover}")
    print("\n(bar: lost, stuck, failed, twice, rec.twice and left all 0; receipt: steps recorded from the receipt a"
          "\n lost run left instead of running again; load: the 1-minute load average at the first kill and at the"
          "\n end; each run also kills and restarts the whole box once)")


if __name__ == "__main__":
    main()

"""Chaos: N tasks through K killed workers, a killed and restarted box, and database faults.

Runs a real box under its supervisor (`manage.py runbox`) for the embedded default and for
PostgreSQL + Redis. While N tasks of `run` steps run it SIGKILLs K busy workers (a worker is busy
while it holds a run's sandbox: the run's resident init below it), on PostgreSQL terminates the
box's database connections T times (`pg_terminate_backend`, on the bench's own database only),
then SIGKILLs the whole box mid-work and starts it again. When every task has ended (or the
deadline passed) it stops the box with Ctrl-C and prints:

- lost: tasks still queued at the end (never run);
- stuck: tasks still running or waiting at the end;
- failed: tasks that failed; those that failed by the attempt limit are counted apart (limit),
  and their message, which says how many attempts were cut by kills, restarts or lease expiry,
  is printed;
- step effects duplicated ("dup"): a step's last line in its task's file beyond one per step.
  With ``--effect end`` (the default) each step appends one line as it ends; with ``--effect
  start-end`` a START line, a sleep, then an END line, and "dup" counts END lines (a START line
  beyond one per step is a step cut off mid-way and run again, which is allowed; the log says it
  was interrupted). A kill after a step's process exited does not run it again: the sandbox's
  init writes the step's receipt before it exits, and the retry records the result from it
  ("receipt" counts those);
- rec.twice: steps whose result is in the log twice (recorded, then run again);
- leftovers: task users, their processes and mounts in the data dir after the stop.

With ``--per-task`` it prints, for each task a kill touched, its runs, lost runs, steps started
again (rerun), steps recorded from a receipt, and the START and END lines beyond one per step.

All zero is the bar (failed: but for the attempt limit, when ``--max-attempts`` lets kills reach
it). Usage: .venv/bin/python bench/chaos.py [--tasks N] [--kills K] [--db-faults T] [options];
the harsher schedule docs/internals/performance-load.md ("Recovery under chaos") gives figures for
(1 to 3 steps with START/END lines, a kill every 2-5 s, 30 kills): .venv/bin/python
bench/chaos.py --only postgres --steps 1-3 --effect start-end --step-sleep 2.5 --kill-every 2-5
--kills 30 --max-attempts 3 --per-task. PostgreSQL + Redis use Redis database
``BOX_BENCH_REDIS_DB`` (default 7), where only the bench's own queue's keys are touched.
"""
from __future__ import annotations

import argparse
import json
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

# The bench's queue has a name of its own in this database: nothing else in it is touched.
REDIS_DB = os.environ.get("BOX_BENCH_REDIS_DB", "7")


def flow_of(steps: int, effect: str, sleep_s: float) -> dict[str, Any]:
    """``steps`` run steps, each writing to a file of its task's own (the workspace's stack shows
    every earlier task's files to later tasks): one line as the last thing it does (``end``), or
    a START line, a sleep, an END line (``start-end``)."""
    if effect == "end":
        return {"steps": [{"run": f"sleep 1.{2 * i}; echo step{i} >> .effects-$BOX_TASK_ID", "name": f"step {i}"}
                          for i in range(steps)]}
    return {"steps": [{"run": f"echo START s{i} r$BOX_RUN >> .effects-$BOX_TASK_ID; sleep {sleep_s:g}; "
                              f"echo END s{i} r$BOX_RUN >> .effects-$BOX_TASK_ID", "name": f"step {i}"}
                      for i in range(steps)]}


def span(text: str) -> tuple[float, float]:
    """"2-5" -> (2.0, 5.0); "3" -> (3.0, 3.0)."""
    low, _, high = text.partition("-")
    return float(low), float(high or low)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class ChaosBox:
    def __init__(self, postgres: bool, max_attempts: int = 6) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="box-chaos-"))
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        self.env.update({
            "BOX_DATA_DIR": str(self.data), "BOX_PORT": str(self.port), "BOX_WORKERS": "2",
            "BOX_QUEUE_NAME": f"chaos-{os.getpid()}", "BOX_QUEUE_POLL_S": "0.05", "BOX_LOG_LEVEL": "WARNING",
            "BOX_LEASE_SECONDS": "5", "BOX_HEARTBEAT_SECONDS": "1", "BOX_RETRY_BACKOFF_SECONDS": "0.5",
            "BOX_MAX_RUN_ATTEMPTS": str(max_attempts), "BOX_SCHEDULER_TICK_SECONDS": "0.5", "BOX_RESEND_S": "3", "BOX_STUCK_S": "6",
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
        """django-q2 worker processes that hold a run's sandbox right now. A run's resident init
        (``setpriv`` execs ``unshare``, whose child is init) is the worker's child from the run's
        first command to its end; each command is forked inside it."""
        assert self.proc is not None
        leader = next((p for p in procs.children(self.proc.pid) if b"runcluster" in _cmdline(p)), None)
        if leader is None:
            return []
        busy = []
        for pid in procs.descendants(leader):
            if b"runcluster" not in _cmdline(pid):
                continue
            kids = procs.children(pid)
            running_a_task = any(b"setpriv" in _cmdline(k) or b"unshare" in _cmdline(k) for k in kids)
            if running_a_task and procs.alive(pid):
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


def _effects(data: Path) -> dict[str, list[str]]:
    """Each task's effects file's lines (in its layer on disk; the longest copy found)."""
    found: dict[str, list[str]] = {}
    for path in data.rglob(".effects-*"):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        task_id = path.name.removeprefix(".effects-")
        if len(lines) > len(found.get(task_id, [])):
            found[task_id] = lines
    return found


# Read from the stopped box's database, one process for every task: its runs (and how each was
# lost), the steps it started, the results it recorded, its interruptions and its error.
DUMP = """
import json
from tasks.models import Run, Task, TaskEvent
out = {}
for task in Task.objects.all():
    runs = list(Run.objects.filter(task=task).order_by('number').values_list('state', 'outcome', 'error'))
    events = list(TaskEvent.objects.filter(task=task).order_by('seq').values_list('kind', 'data'))
    out[task.pk] = {
        'runs': len(runs), 'lost': sum(state == 'lost' and outcome == 'lost' for state, outcome, _ in runs),
        'handed_back': sum(outcome == 'handed back' for _, outcome, _ in runs),
        'starts': [d.get('step') for k, d in events if k == 'step'],
        'results': [d.get('step') for k, d in events if k == 'step_result' and d.get('ok')],
        'from_receipt': sum(1 for k, d in events if k == 'step_result' and d.get('fromReceipt')),
        'interrupted': sum(1 for k, d in events if k == 'note' and d.get('interrupted')),
        'error': task.error,
    }
print(json.dumps(out))
"""


def _beyond_one(values: list[Any]) -> int:
    return sum(values.count(v) - 1 for v in set(values))


def _per_task(ids: list[str], steps: dict[str, int], states: dict[str, str], dump: dict[str, Any],
              effects: dict[str, list[str]], effect: str) -> list[dict[str, Any]]:
    rows = []
    for task_id in ids:
        info = dump.get(task_id, {})
        lines = effects.get(task_id, [])
        if effect == "end":
            starts, ends = [], [line for line in lines if line.startswith("step")]
        else:
            starts = [line.split()[1] for line in lines if line.startswith("START ")]
            ends = [line.split()[1] for line in lines if line.startswith("END ")]
        done = states.get(task_id) == "done"
        rows.append({
            "id": task_id, "state": states.get(task_id, "unknown"), "steps": steps[task_id],
            "runs": info.get("runs", 0), "lost": info.get("lost", 0), "handed_back": info.get("handed_back", 0),
            "rerun": _beyond_one(info.get("starts", [])), "receipt": info.get("from_receipt", 0),
            "interrupted": info.get("interrupted", 0), "rec_twice": _beyond_one(info.get("results", [])),
            "dup_start": _beyond_one(starts), "dup_end": _beyond_one(ends),
            # a done task must show every step's end exactly once
            "missing_end": max(0, steps[task_id] - len(set(ends))) if done else 0,
            "error": info.get("error", ""),
        })
    return rows


def _leftovers(box: ChaosBox) -> list[str]:
    """What the stopped box left on the host: its task users (with their processes), mounts in
    its data dir. The users are found by the box's own code (their comment names the box)."""
    found = box.manage("shell", "-c", "from tasks.sandbox import accounts, users\n"
                       "for i in users.pool_users(): print('user', i.name, 'processes', accounts.processes_of(i.uid))")
    leftovers = [line for line in found.splitlines() if line.startswith("user ")]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if str(box.data) in line:
            leftovers.append("mount " + line.split()[4])
    return leftovers


def run(postgres: bool, args: argparse.Namespace) -> dict[str, Any]:
    box = ChaosBox(postgres, args.max_attempts)
    rng = random.Random(args.seed)
    low, high = (int(n) for n in span(args.steps))
    try:
        box.setup()
        box.start()
        box.request("PATCH", "/api/settings", {"maxActiveTasks": args.tasks + 10})
        steps: dict[str, int] = {}
        ids = []
        for n in range(args.tasks):
            count = rng.randint(low, high)
            task_id = box.request("POST", "/api/tasks", {"title": f"chaos {n}",
                                                         "flow": flow_of(count, args.effect, args.step_sleep)})["id"]
            ids.append(task_id)
            steps[task_id] = count
        killed = terminated = 0
        every = span(args.kill_every)
        crash_at = max(1, args.kills // 2) if args.crash else -1
        started = time.monotonic()
        load_start = os.getloadavg()[0]
        states = {t: "queued" for t in ids}
        next_kill = time.monotonic() + rng.uniform(*every)
        while killed < args.kills and time.monotonic() - started < args.deadline / 2:
            if time.monotonic() < next_kill:
                time.sleep(min(0.05, max(0.0, next_kill - time.monotonic())))
                continue
            busy = box.busy_workers()
            if not busy:  # the next busy worker is killed as soon as there is one
                states = _states(box, ids)
                if not any(s in ("queued", "running") for s in states.values()):
                    break  # nothing left to kill a worker of
                time.sleep(0.05)
                continue
            os.kill(rng.choice(busy), signal.SIGKILL)
            killed += 1
            if postgres and terminated < args.db_faults:
                terminated += 1 if box.terminate_backends() else 0
            if killed == crash_at:
                box.crash()
                box.start()
            next_kill = time.monotonic() + rng.uniform(*every)
        while postgres and terminated < args.db_faults:
            terminated += 1 if box.terminate_backends() else 0
            time.sleep(0.5)
        end = time.monotonic() + args.deadline
        states = _states(box, ids)
        while time.monotonic() < end and any(s in ("queued", "running", "waiting") for s in states.values()):
            time.sleep(1)
            states = _states(box, ids)
        load_end = os.getloadavg()[0]
        stop_s = box.stop()
        dump = json.loads(box.manage("shell", "-c", DUMP).splitlines()[-1])
        rows = _per_task(ids, steps, states, dump, _effects(box.data), args.effect)
        limit = [r for r in rows if r["state"] == "failed" and "gave up" in r["error"]]
        return {
            "tasks": args.tasks, "steps": sum(steps.values()), "kills": killed, "db_faults": terminated,
            "crashes": 1 if killed >= crash_at > 0 else 0,
            "done": sum(s == "done" for s in states.values()),
            "lost": sum(s == "queued" for s in states.values()),
            "stuck": sum(s in ("running", "waiting") for s in states.values()),
            "failed": sum(s == "failed" for s in states.values()), "limit": len(limit),
            "dup": sum(r["dup_end"] for r in rows), "rerun": sum(r["rerun"] for r in rows),
            "missing_end": sum(r["missing_end"] for r in rows),
            "recorded_twice": sum(r["rec_twice"] for r in rows), "from_receipt": sum(r["receipt"] for r in rows),
            "load": (load_start, load_end), "leftovers": _leftovers(box), "stop_s": stop_s,
            "elapsed_s": time.monotonic() - started, "rows": rows,
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
    parser.add_argument("--steps", default="3", help="run steps per task, or a range (1-3: each task picks)")
    parser.add_argument("--effect", choices=["end", "start-end"], default="end",
                        help="each step appends a line as it ends, or a START line, a sleep, an END line")
    parser.add_argument("--step-sleep", type=float, default=1.0, help="seconds between START and END")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--kill-every", default="0.3-1.0", help="seconds between kills (a random pick in the range)")
    parser.add_argument("--no-crash", dest="crash", action="store_false", help="no kill and restart of the whole box")
    parser.add_argument("--db-faults", type=int, default=5)
    parser.add_argument("--max-attempts", type=int, default=6, help="BOX_MAX_RUN_ATTEMPTS")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--per-task", action="store_true", help="a line for each task a kill touched")
    parser.add_argument("--only", choices=["embedded", "postgres"], default=None)
    args = parser.parse_args()
    rows = []
    for label, pg in (("embedded (SQLite, ORM queue)", False), ("PostgreSQL + Redis", True)):
        if args.only and args.only != ("postgres" if pg else "embedded"):
            continue
        rows.append((label, run(pg, args)))
    for label, r in rows:
        if args.per_task:
            print(f"\n{label}: tasks a kill touched")
            for t in r["rows"]:
                if t["lost"] or t["handed_back"] or t["dup_start"] or t["dup_end"] or t["state"] != "done":
                    print(f"  {t['id']} {t['state']:6} steps={t['steps']} runs={t['runs']} lost={t['lost']} "
                          f"handed_back={t['handed_back']} rerun={t['rerun']} receipt={t['receipt']} "
                          f"interrupted={t['interrupted']} dup_start={t['dup_start']} dup_end={t['dup_end']}"
                          f"{' missing_end=' + str(t['missing_end']) if t['missing_end'] else ''}")
        for t in r["rows"]:
            if t["state"] == "failed":
                print(f"{label}: {t['id']} failed: {t['error']}")
    print(f"\n{'configuration':30} {'tasks':>5} {'steps':>5} {'kills':>5} {'db':>3} {'done':>5} {'lost':>5} {'stuck':>5} "
          f"{'failed':>6} {'limit':>5} {'dup':>4} {'rec.twice':>9} {'rerun':>5} {'receipt':>7} {'left':>5} {'stop s':>6} "
          f"{'total s':>7} load")
    for label, r in rows:
        print(f"{label:30} {r['tasks']:5} {r['steps']:5} {r['kills']:5} {r['db_faults']:3} {r['done']:5} {r['lost']:5} "
              f"{r['stuck']:5} {r['failed']:6} {r['limit']:5} {r['dup']:4} {r['recorded_twice']:9} {r['rerun']:5} "
              f"{r['from_receipt']:7} {len(r['leftovers']):5} {r['stop_s']:6.1f} {r['elapsed_s']:7.0f} "
              f"{r['load'][0]:.1f}-{r['load'][1]:.1f}")
        if r["missing_end"]:
            print(f"{label}: {r['missing_end']} steps of done tasks without their effect")
    for label, r in rows:
        for leftover in r["leftovers"]:
            print(f"left by {label}: {leftover}")
    print("\n(bar: lost, stuck, dup (step effects duplicated), rec.twice and left all 0, failed too but for the attempt"
          "\n limit (limit); rerun: steps cut off mid-way and started again; receipt: steps recorded from the receipt a"
          "\n lost run left instead of running again; load: the 1-minute load average at the first kill and at the"
          "\n end; a run also kills and restarts the whole box once unless --no-crash)")


if __name__ == "__main__":
    main()

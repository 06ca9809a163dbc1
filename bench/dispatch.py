"""POST /api/tasks -> first step started (p50/p95) and -> finished (p50), trivial tasks per second,
and flow steps per second within one task.

The box runs with its default queue poll, so the figures are what a default box gives.

Runs a real box (daphne + qcluster + scheduler) for the embedded default and for
PostgreSQL + Redis, and prints the figures beside the targets in docs/internals/performance.md.
Usage: .venv/bin/python bench/dispatch.py [--latency N] [--throughput N] [--steps N] [--chain N]
[--configs embedded,pg] [--skip-chain] [--workers N] [--rounds N]
Also the chained case: N trivial tasks chained by ``dependsOn`` (all posted at once), end to end,
beside the same N created one after another by a client; and where a trivial task's time goes,
phase by phase (medians of the latency tasks, and of the chain's links). The burst also gives
the box's CPU per task (web, cluster, scheduler), and the box's per-task cost beyond the
sandbox's floors measured in the same run (bare ``unshare``, overlay mount, a user made with
``useradd``/``userdel`` as the design's floor, and a pool claim) as a multiple of them. The first
line gives the machine's speed (CPU ms of a fixed pure-Python loop), so runs on different days
can be compared.
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import os
import pwd
import resource
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox, new_data_dir, percentile  # noqa: E402

TRIVIAL = {"steps": [{"write": {"path": "out.txt", "content": "x"}}]}


# A trivial task's life, each mark from the box's own records (the client's clock for the POST,
# the same machine's): the phases are the gaps between consecutive marks.
PHASES = (("created", "POST -> task row and first run committed"),
          ("claimed", "-> a worker claimed the run (queue)"),
          ("running", "-> moved to running, isolation noted"),
          ("step", "-> first step started (view opened, action counted)"),
          ("result", "-> step result recorded"),
          ("done", "-> task done"))


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def marks_of(box: BenchBox, task_id: str, sent: float) -> dict[str, float]:
    """The moments of ``task_id``'s life (seconds since the epoch); ``sent``: when its wait began
    (the POST, or the moment its dependency finished)."""
    events = box.get(f"/api/tasks/{task_id}/events?after=0")["events"]
    first = box.get(f"/api/tasks/{task_id}/runs?sort=number")["results"][0]

    def event(kind: str, prefix: str = "") -> float:
        return next(_ts(e["createdAt"]) for e in events if e["kind"] == kind and e["summary"].startswith(prefix))

    return {"sent": sent, "created": _ts(first["createdAt"]), "claimed": _ts(first["startedAt"]),
            "running": event("note", "isolation"), "step": event("step"), "result": event("step_result"),
            "done": _ts(box.get(f"/api/tasks/{task_id}")["finishedAt"])}


def phase_table(all_marks: list[dict[str, float]]) -> list[tuple[str, float]]:
    """Median ms of each phase over ``all_marks``."""
    rows, before = [], "sent"
    for name, label in PHASES:
        rows.append((label, percentile([(m[name] - m[before]) * 1000 for m in all_marks], 50)))
        before = name
    return rows


def first_step_latency(box: BenchBox, n: int) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """POST -> first step started, and POST -> task finished, for ``n`` tasks one after another;
    and each task's marks."""
    to_step, to_done, marks = [], [], []
    for i in range(n):
        sent = time.time()
        task = box.post("/api/tasks", {"title": f"latency {i}", "flow": TRIVIAL})
        while True:
            events = box.get(f"/api/tasks/{task['id']}/events?after=0")["events"]
            step = next((e for e in events if e["kind"] == "step"), None)
            if step:
                started = datetime.fromisoformat(step["createdAt"]).timestamp()
                to_step.append((started - sent) * 1000)
                break
            time.sleep(0.005)
        while not (finished := box.get(f"/api/tasks/{task['id']}")["finishedAt"]):
            time.sleep(0.005)
        to_done.append((datetime.fromisoformat(finished).timestamp() - sent) * 1000)
        marks.append(marks_of(box, task["id"], sent))
    return to_step, to_done, marks


_TICK = os.sysconf("SC_CLK_TCK")


def box_cpu_s(box: BenchBox) -> dict[str, float]:
    """CPU seconds used so far by each of the box's processes with every descendant (web;
    the cluster: its workers, their janitor threads, each sandboxed child and account tool, counted
    in its parent once waited for; the scheduler)."""
    parents, times, servers = {}, {}, set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(f) for f in fields[11:15]) / _TICK
        if box.db_name:
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                    command = handle.read()
            except OSError:
                continue
            # "postgres: 15/main: <user> <database> <client> <state>": this box's own backends
            if command.startswith(b"postgres: ") and f" {box.db_name} ".encode() in command:
                servers.add(int(entry.name))
    found = {}
    for role, proc in zip(("web", "cluster", "scheduler"), box.procs, strict=True):
        tree, grew = {proc.pid}, True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in tree} - tree
            grew = bool(more)
            tree |= more
        found[role] = sum(times.get(pid, 0.0) for pid in tree)
    if box.db_name:
        # The shared server's backends serving this box (a backend that ended meanwhile is missed:
        # the box's connections are kept, so few do).
        found["postgres"] = sum(times[pid] for pid in servers)
    return found


def throughput(box: BenchBox, n: int) -> tuple[float, dict[str, float]]:
    """Trivial tasks completed per second for ``n`` posted at once, and the box's CPU ms per task
    by process (web, cluster, scheduler)."""
    cpu_before = box_cpu_s(box)
    start = time.time()
    ids = [box.post("/api/tasks", {"title": f"bulk {i}", "flow": TRIVIAL})["id"] for i in range(n)]
    # Polled every 0.05 s for one task still active (a page of one, cheap to build): the web
    # process answering is one of the box's processes whose CPU is counted per task.
    while box.get("/api/tasks?state=queued,running,waiting&limit=1")["results"]:
        time.sleep(0.05)
    ended = time.time()
    failed = [t for t in box.get(f"/api/tasks?state=failed&limit={n + 10}")["results"] if t["id"] in set(ids)]
    if failed:
        print(f"  ({len(failed)} of the {n} burst tasks failed; see the box's log)", flush=True)
    rate = n / (ended - start)
    released(box)  # the janitors' release of the last tasks is part of their cost
    cpu_after = box_cpu_s(box)
    return rate, {role: (cpu_after[role] - cpu_before[role]) * 1000 / n for role in cpu_after}


def median_round(bursts: list[tuple[float, dict[str, float]]]) -> tuple[float, dict[str, float]]:
    """The burst of median rate among ``bursts`` (rate, CPU by process): one machine's bursts of the
    same code move by a quarter between runs, so one burst alone says little."""
    return sorted(bursts, key=lambda burst: burst[0])[len(bursts) // 2]


def released(box: BenchBox, timeout: float = 60) -> None:
    """Wait until no task holds a user of the pool: every ended task's release is complete."""
    claims = box.data / "users"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (claims.is_dir() and any(_held_claim(entry) for entry in os.scandir(claims))):
            return
        time.sleep(0.05)
    raise RuntimeError(f"task users still claimed {timeout:.0f} s after the burst")


def _held_claim(entry: os.DirEntry[str]) -> bool:
    """A pool user's claim held by a task (a claim names its holder; a free user's, or one being
    made or deleted, starts with a dot). A claim the pool let go of meanwhile is not held."""
    if entry.name.startswith("."):
        return False
    try:
        return not os.readlink(entry.path).startswith(".")
    except FileNotFoundError:
        return False


_UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--mount", "--ipc", "--uts", "/bin/true"]


def _cpu_ms() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime) * 1000


def machine_speed() -> float:
    """CPU ms of a fixed pure-Python loop: how fast this machine is today (the box's figures
    scale with it; a shared or throttled host can halve it)."""
    start = time.thread_time()
    total = 0
    for i in range(2_000_000):
        total += i
    return (time.thread_time() - start) * 1000


def floors(n: int) -> dict[str, tuple[float, float]]:
    """The sandbox's floors on this machine, now: median wall ms and mean CPU ms of a bare ``unshare``
    with the task's namespaces, a bare overlay mount and unmount, a bare claim and give-back of a
    pool user (a lock, the account list read, a link made and removed), and a user made and
    removed with the system's tools (``useradd`` + ``userdel``: what a task's own user costs
    without a pool, the floor the design names)."""
    libc = ctypes.CDLL(None, use_errno=True)
    scratch = new_data_dir("box-bench-floor-")  # beside the bench box's data
    for name in ("lower", "upper", "work", "merged", "users"):
        (scratch / name).mkdir()
    (scratch / "lower" / "file.txt").write_text("x")
    options = f"lowerdir={scratch / 'lower'},upperdir={scratch / 'upper'},workdir={scratch / 'work'}".encode()
    merged = str(scratch / "merged").encode()

    def overlay() -> None:
        if libc.mount(b"overlay", merged, b"overlay", 0, options) != 0:
            raise OSError(ctypes.get_errno(), "overlay mount")
        libc.umount2(merged, 0)

    def claim() -> None:
        fd = os.open(scratch / "users" / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            [e.pw_name for e in pwd.getpwall() if e.pw_name.startswith("box-")]
            list(os.scandir(scratch / "users"))
            os.symlink("task", scratch / "users" / "user")
        finally:
            os.close(fd)
        os.unlink(scratch / "users" / "user")

    def account() -> None:
        name = f"box-floor-{os.getpid()}"
        try:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
        finally:  # also when the bench is stopped between the two
            subprocess.run(["userdel", name], check=False, capture_output=True)

    found = {}
    try:
        for name, step in (("unshare", lambda: subprocess.run(_UNSHARE, check=True)), ("overlay mount", overlay),
                           ("user claim", claim), ("user made (useradd + userdel)", account)):
            wall, cpu_before = [], _cpu_ms()
            for _ in range(n):
                start = time.perf_counter()
                step()
                wall.append((time.perf_counter() - start) * 1000)
            found[name] = (percentile(wall, 50), (_cpu_ms() - cpu_before) / n)  # CPU: the mean (tick-sized samples)
    finally:
        libc.umount2(merged, 2)
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    return found


STEP_SPLIT: dict[str, list[float]] = {"step -> its result": [], "result -> next step": []}


def flow_steps(box: BenchBox, n: int, kind: str = "write") -> float:
    """Steps per second within one task: ``n`` write steps (or ``run: true`` steps, each a
    sandboxed process), first step started -> last started, from the box's own timestamps. The
    task is polled every 0.25 s: the figure does not depend on when the bench reads it, and a
    client polling faster would take a core's share from the steps it measures. For run steps,
    each step's split (its start event -> its result event -> the next start) goes to
    ``STEP_SPLIT``, in ms."""
    if kind == "run":
        flow = {"steps": [{"run": "true"} for _ in range(n)]}
    else:
        flow = {"steps": [{"write": {"path": f"s{i}.txt", "content": str(i)}} for i in range(n)]}
    task = box.post("/api/tasks", {"title": "steps", "flow": flow})
    while not box.get(f"/api/tasks/{task['id']}")["finishedAt"]:
        time.sleep(0.25)
    events, after = [], 0
    while page := box.get(f"/api/tasks/{task['id']}/events?after={after}&limit=1000")["events"]:
        events += page
        after = page[-1]["seq"]
    marks = [(e["kind"], datetime.fromisoformat(e["createdAt"]).timestamp()) for e in events
             if e["kind"] in ("step", "step_result")]
    if kind == "run":
        for (kind_a, at_a), (kind_b, at_b) in zip(marks, marks[1:]):
            name = "step -> its result" if (kind_a, kind_b) == ("step", "step_result") else "result -> next step"
            STEP_SPLIT[name].append((at_b - at_a) * 1000)
    steps = [at for name, at in marks if name == "step"]
    return (len(steps) - 1) / (steps[-1] - steps[0]) if len(steps) > 1 else float("nan")


def _wait_done(box: BenchBox, task_id: str, poll_s: float = 0.005) -> str:
    while not (finished := box.get(f"/api/tasks/{task_id}")["finishedAt"]):
        time.sleep(poll_s)
    return str(finished)


def chained_by_depends_on(box: BenchBox, n: int) -> tuple[float, list[dict[str, float]], dict[str, float]]:
    """``n`` trivial tasks, each depending on the one before, all posted at once: seconds from the
    first POST to the last task done, each link's marks from the moment the task before it
    finished, and the box's CPU ms per task by process (the releases included). The box starts
    each as the one before ends; the end is the box's own record, so the last task is polled
    every 0.05 s (a client polling every 5 ms would keep the web busy on one of two cores)."""
    cpu_before = box_cpu_s(box)
    start = time.time()
    previous: str | None = None
    ids = []
    for i in range(n):
        body: dict[str, object] = {"title": f"chain {i}", "flow": TRIVIAL}
        if previous:
            body["dependsOn"] = [previous]
        previous = box.post("/api/tasks", body)["id"]
        ids.append(previous)
    last = _wait_done(box, ids[-1], poll_s=0.05)
    released(box)
    cpu_after = box_cpu_s(box)
    links = [marks_of(box, later, _ts(box.get(f"/api/tasks/{earlier}")["finishedAt"]))
             for earlier, later in zip(ids, ids[1:], strict=False)]
    cpu = {role: (cpu_after[role] - cpu_before[role]) * 1000 / n for role in cpu_after}
    return datetime.fromisoformat(last).timestamp() - start, links, cpu


def chained_by_client(box: BenchBox, n: int) -> float:
    """The same ``n`` tasks, a client creating each after the one before finished."""
    start = time.time()
    last = ""
    for i in range(n):
        task = box.post("/api/tasks", {"title": f"client chain {i}", "flow": TRIVIAL})
        last = _wait_done(box, task["id"])
    return datetime.fromisoformat(last).timestamp() - start


# The first step's targets (issue 19): p50 on both, and p95 on PostgreSQL + Redis.
CONFIGS = {"embedded": ("embedded (SQLite, ORM queue, polling)", False, False, "<= 150"),
           "pg": ("PostgreSQL + Redis", True, True, "<= 100/200")}


def print_phases(title: str, tables: dict[str, list[tuple[str, float]]]) -> None:
    labels = list(tables)
    print(f"\n{title:58}" + "".join(f" {label:>12}" for label in labels))
    for i, (phase, _) in enumerate(next(iter(tables.values()))):
        print(f"{phase:58}" + "".join(f" {tables[label][i][1]:12.0f}" for label in labels))
    print(f"{'sum of medians':58}" + "".join(f" {sum(ms for _, ms in tables[label]):12.0f}" for label in labels))


# The two floors the overhead is measured against: the design's (a task's own user made and
# removed by the system's tools, as a sandbox without a pool pays it) and the pool's (a claim,
# what this box pays per task instead). docs/internals/decisions-performance.md#performance says why both are printed.
FLOORS = {"design's floor (unshare + mount + useradd/userdel)": ("unshare", "overlay mount", "user made (useradd + userdel)"),
          "pool floor (unshare + mount + pool claim)": ("unshare", "overlay mount", "user claim")}


def command_floor(n: int) -> tuple[float, float]:
    """A sandboxed command's floor now: a bare ``unshare`` with the task's namespaces running a
    system ``python3 -I -S`` that starts ``/bin/true`` (what any sandbox with an init of its own
    pays per command), median wall ms and mean CPU ms."""
    argv = [*_UNSHARE[:-1], "/usr/bin/python3", "-I", "-S", "-c", "import subprocess; subprocess.run(['/bin/true'])"]
    wall, before = [], _cpu_ms()
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(argv, check=True)
        wall.append((time.perf_counter() - start) * 1000)
    return percentile(wall, 50), (_cpu_ms() - before) / n


def print_run_steps(rows: list[tuple[str, float, float]], n: int) -> None:
    """Run steps beside the floor of a sandboxed command measured now: the box's overhead per
    command (the agent's commands take the same path: a ``run`` step each)."""
    wall, cpu = command_floor(n)
    print(f"\nrun steps beside a sandboxed command's floor (unshare + python3 + /bin/true: {wall:.1f} ms wall, {cpu:.1f} ms CPU)")
    print(f"  {'configuration':50} {'ms/step':>8} {'over floor':>10} {'target':>7} {'cpu ms':>7}")
    for label, rate, step_cpu in rows:
        print(f"  {label:50} {1000 / rate:8.1f} {1000 / rate - wall:10.1f} {'<= 25':>7} {step_cpu:7.1f}")


def print_overhead(floor: dict[str, tuple[float, float]], rows: list[tuple[str, float, float]]) -> None:
    """The box's cost per trivial task beyond the sandbox's floors, as a multiple of them: wall
    (a task's POST -> done, one at a time) and CPU (the burst's CPU per task)."""
    print(f"\n{'sandbox floors (measured now)':52} {'wall ms':>8} {'cpu ms':>8}   load {os.getloadavg()[0]:.1f}")
    for name, (w, c) in floor.items():
        print(f"  {name:50} {w:8.1f} {c:8.1f}")
    for floor_name, parts in FLOORS.items():
        wall, cpu = sum(floor[p][0] for p in parts), sum(floor[p][1] for p in parts)
        print(f"\nbox overhead beyond the {floor_name}: {wall:.1f} ms wall, {cpu:.1f} ms CPU")
        print(f"  {'':50} {'wall x':>8} {'cpu x':>8} {'target':>7}")
        for label, done_ms, cpu_ms in rows:
            print(f"  {label:50} {(done_ms - wall) / wall:8.1f} {(cpu_ms - cpu) / cpu:8.1f} {'<= 3':>7}")
    print("(overhead: (the box's per-task figure - the floor) / the floor; wall from done p50, CPU from the burst)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=int, default=30)
    parser.add_argument("--throughput", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chain", type=int, default=40)
    parser.add_argument("--run-steps", type=int, default=40, help="run: true steps in one task, for run steps/s")
    parser.add_argument("--configs", default="embedded,pg", help="embedded, pg, or both (comma separated)")
    parser.add_argument("--skip-chain", action="store_true")
    parser.add_argument("--workers", type=int, default=2, help="the cluster's worker processes (BOX_WORKERS)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="bursts and chains run this many times in each box; the median is printed, then each")
    args = parser.parse_args()
    configs = [CONFIGS[name] for name in args.configs.split(",")]
    print(f"load average at the start: {os.getloadavg()[0]:.1f}; machine speed: a 2M-step Python loop takes"
          f" {min(machine_speed() for _ in range(3)):.0f} ms of CPU", flush=True)
    print(f"\n{'configuration':40} {'p50 ms':>8} {'p95 ms':>8} {'target p50/p95':>15} {'done p50':>9} {'tasks/s':>8} {'target':>7}"
          f" {'cpu ms/task':>12} {'steps/s':>8} {'target':>7} {'load':>5}")
    phases: dict[str, list[tuple[str, float]]] = {}
    run_floors: list[tuple[str, float, float]] = []
    overheads: list[tuple[str, float, float]] = []
    for label, pg, redis, target in configs:
        with BenchBox(postgres=pg, redis=redis, workers=args.workers) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.throughput + 10})
            lat, done, marks = first_step_latency(box, args.latency)
            bursts = [throughput(box, args.throughput) for _ in range(args.rounds)]
            rate, cpu_by_role = median_round(bursts)
            cpu_per_task = sum(ms for role, ms in cpu_by_role.items() if role != "postgres")  # the box's own
            cpu_before = box_cpu_s(box)
            steps = flow_steps(box, args.steps)
            cpu_after = box_cpu_s(box)
            cpu_by_step = {role: (cpu_after[role] - cpu_before[role]) * 1000 / args.steps for role in cpu_after}
            run_rounds = []
            for split in STEP_SPLIT.values():
                split.clear()
            for _ in range(args.rounds):
                cpu_before = box_cpu_s(box)
                rate_run = flow_steps(box, args.run_steps, "run")
                cpu_after = box_cpu_s(box)
                run_rounds.append((rate_run, sum(cpu_after[r] - cpu_before[r] for r in cpu_after if r != "postgres")
                                   * 1000 / args.run_steps))
        p50, p95, done_p50 = percentile(lat, 50), percentile(lat, 95), percentile(done, 50)
        phases[label.split(" ")[0]] = phase_table(marks)
        overheads.append((label, done_p50, cpu_per_task))
        print(f"{label:40} {p50:8.0f} {p95:8.0f} {target:>15} {done_p50:9.0f} {rate:8.1f} {'>= 30' if pg else '>= 20':>7}"
              f" {cpu_per_task:12.0f} {steps:8.0f} {'>= 100':>7} {os.getloadavg()[0]:5.1f}", flush=True)
        print(f"{'  cpu ms/task by process':40} " + ", ".join(f"{role} {ms:.0f}" for role, ms in cpu_by_role.items()), flush=True)
        print(f"{'  each burst: tasks/s (cpu ms/task)':40} "
              + ", ".join(f"{r:.1f} ({sum(c.values()) - c.get('postgres', 0):.0f})" for r, c in bursts), flush=True)
        print(f"{'  cpu ms/step by process (steps/s task)':40} " + ", ".join(f"{role} {ms:.1f}" for role, ms in cpu_by_step.items()),
              flush=True)
        run_rate, run_cpu = sorted(run_rounds)[len(run_rounds) // 2]
        print(f"{'  run steps/s in one task (target >= 40)':40} {run_rate:.1f} (median of "
              + ", ".join(f"{r:.1f}" for r, _ in run_rounds) + f"); box cpu {run_cpu:.1f} ms/step", flush=True)
        print(f"{'  a run step, median ms (box timestamps)':40} "
              + ", ".join(f"{name} {percentile(ms, 50):.1f}" for name, ms in STEP_SPLIT.items() if ms), flush=True)
        run_floors.append((label, run_rate, run_cpu))
    print(f"\n({args.latency} sequential tasks for latency; {args.throughput} trivial flow tasks posted at once for throughput,"
          f" {args.rounds} times (the median burst shown, by tasks/s);"
          f" one task of {args.steps} write steps for steps/s; load: the 1-minute load average after each row)")
    print_phases("a trivial task, median ms per phase (latency tasks)", phases)
    print_run_steps(run_floors, args.latency)
    print_overhead(floors(args.latency), overheads)
    if args.skip_chain:
        return
    print(f"\n{'configuration':40} {'dependsOn s':>12} {'client s':>9} {'target':>7} {'load':>5}   ({args.chain} tasks chained)")
    links: dict[str, list[tuple[str, float]]] = {}
    for label, pg, redis, _ in configs:
        with BenchBox(postgres=pg, redis=redis, workers=args.workers) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.chain + 10})
            chains = [chained_by_depends_on(box, args.chain) for _ in range(args.rounds)]
            by_client = chained_by_client(box, args.chain)
        by_edges, marks, cpu_by_role = sorted(chains, key=lambda chain: chain[0])[len(chains) // 2]
        links[label.split(" ")[0]] = phase_table(marks)
        print(f"{label:40} {by_edges:12.1f} {by_client:9.1f} {'<= 1.5':>7} {os.getloadavg()[0]:5.1f}", flush=True)
        print(f"{'  dependsOn cpu ms/task by process':40} " + ", ".join(f"{role} {ms:.0f}" for role, ms in cpu_by_role.items()),
              flush=True)
        print(f"{'  each chain, s (in the order run)':40} " + ", ".join(f"{chain[0]:.2f}" for chain in chains), flush=True)
    print_phases("a chain's link, median ms per phase (from the task before done)", links)
    print("(the first phase of a link: the dependency done -> its dependent's first run committed;"
          f" the median of {args.rounds} chains, each in the same box after the one before)")


if __name__ == "__main__":
    main()

"""Memory of a running box, and paging a 10,000-event task log.

A real box (daphne + the worker cluster as ``runbox`` starts it + scheduler), on the embedded
default and on PostgreSQL + Redis. For each it prints, beside the targets of docs/internals/performance.md:

- the web process's RSS after start, and after N API requests and N portal page loads;
- each cluster worker's RSS, PSS and USS (``/proc/<pid>/smaps_rollup``) idle at start, and idle
  after T trivial sandboxed tasks (and the cluster's other processes, for the record);
- paging one task's log of 10,000 events and 10,000 actions through the API: the first page, a
  page in the middle and the last page (events by ``after``, actions by their cursor), and the
  task window's load (its page and its detail view), beside the same for a task whose log is one
  page (200 events and actions).

The 10,000 events and actions are written into the bench box's database in bulk (one command,
as the box's own models) for a real task, so the log is there in seconds (on PostgreSQL then
analysed, as autovacuum would within a minute); the reads all go through the running box. Usage: .venv/bin/python bench/memory.py [--requests N] [--tasks N]
[--log N] [--configs embedded,pg] [--recycle N] [--env NAME=VALUE] [--paging-only]
"""
from __future__ import annotations

import argparse
import http.cookiejar
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox, percentile  # noqa: E402

from boxsite.core import procs  # noqa: E402 - the repository's root is on the path once harness is imported

TRIVIAL = {"steps": [{"write": {"path": "out.txt", "content": "x"}}]}
WEB_TARGET_MB = 150
WORKER_TARGET_MB = 80
PAGE = 200
REPEAT = 15

# Written by ``manage.py shell`` in the bench box: ``count`` events and actions for one task, a
# millisecond apart, after the events it already has.
FORGE_LOG = """
from datetime import timedelta
from django.db import connection, transaction
from django.utils import timezone
from approvals.models import Action, ActionState
from tasks.models import EventKind, Task, TaskEvent
task = Task.objects.get(pk={task_id!r})
count = {count}
for model in (TaskEvent, Action):
    model._meta.get_field("created_at").auto_now_add = False
base = timezone.now() - timedelta(milliseconds=count + 1000)
with transaction.atomic():
    first = task.event_seq + 1
    TaskEvent.objects.bulk_create(
        [TaskEvent(task=task, seq=first + i, kind=EventKind.OUTPUT, summary=f"line {{i}}", data={{"i": i}},
                   created_at=base + timedelta(milliseconds=i)) for i in range(count)], batch_size=2000)
    Task.objects.filter(pk=task.pk).update(event_seq=first + count - 1)
    Action.objects.bulk_create(
        [Action(task=task, tool="bench.tool", position=f"step:{{i}}", args={{"i": i}}, state=ActionState.SUCCEEDED,
                idempotency_key=f"bench-{{task.pk}}-{{i}}", created_at=base + timedelta(milliseconds=i))
         for i in range(count)], batch_size=2000)
if connection.vendor == "postgresql":  # what autovacuum does within a minute of such a write
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE approvals_action")
        cursor.execute("ANALYZE tasks_taskevent")
"""


def mb(kb: int) -> float:
    return kb / 1024


def memory_of(pid: int) -> dict[str, int]:
    """RSS, PSS and USS (private clean + dirty) of ``pid`` in kB, from smaps_rollup."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0])
    return {"rss": fields["Rss"], "pss": fields["Pss"], "uss": fields["Private_Clean"] + fields["Private_Dirty"]}


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cluster_processes(leader: int) -> dict[str, list[int]]:
    """The cluster's processes by role: the leader, django-q2's sentinel, its workers (named
    ``box-worker`` by the box) and the rest (its monitor and pusher)."""
    sentinels = procs.children(leader)
    below = [pid for s in sentinels for pid in procs.children(s)]
    workers = [pid for pid in below if comm(pid) == "box-worker"]
    return {"leader": [leader], "sentinel": sentinels, "worker": workers, "other": [p for p in below if p not in workers]}


def cpu_ticks(pids: list[int]) -> int:
    return sum(procs.cpu_ticks(pid) for pid in pids)


def wait_idle(pids: list[int], quiet_s: float = 1.0, deadline_s: float = 60.0) -> None:
    """Until ``pids`` used no CPU for ``quiet_s`` (their janitors done), at most ``deadline_s``."""
    end = time.monotonic() + deadline_s
    before, since = cpu_ticks(pids), time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.2)
        now = cpu_ticks(pids)
        if now != before:
            before, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


class Portal:
    """A signed-in browser session: the login form, then pages with its cookie."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        form = self.get("/login")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token, "no CSRF token on the login page"
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1), "username": "bench",
                                       "password": "bench-password"}).encode()
        request = urllib.request.Request(self.base + "/login", data=body, headers={"Referer": self.base + "/login"})
        with self.opener.open(request, timeout=60) as response:
            assert response.url.endswith("/tasks"), f"sign-in failed: ended at {response.url}"

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=60) as response:
            return response.read().decode()


def timed(call: Callable[[], object], repeat: int = REPEAT) -> float:
    """Median ms of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return percentile(times, 50)


def wait_done(box: BenchBox, ids: list[str]) -> None:
    pending = set(ids)
    while pending:
        pending -= {t["id"] for t in box.get("/api/tasks?state=done&limit=200")["results"]}
        if pending:
            failed = box.get("/api/tasks?state=failed&limit=200")["results"]
            if failed:
                raise RuntimeError(f"a trivial task failed: {failed[0]['id']}: {failed[0].get('error')}")
            time.sleep(0.1)


def show_cluster(label: str, leader: int) -> None:
    family = cluster_processes(leader)
    for role in ("worker", "leader", "sentinel", "other"):
        for pid in family[role]:
            m = memory_of(pid)
            target = f"<= {WORKER_TARGET_MB}" if role == "worker" else ""
            print(f"  {label:28} {role:9} {pid:>8} {mb(m['rss']):7.1f} {target:>7} {mb(m['pss']):7.1f} {mb(m['uss']):7.1f}"
                  f" {os.getloadavg()[0]:5.1f}", flush=True)


def web_row(box: BenchBox, label: str) -> None:
    m = memory_of(box.procs[0].pid)
    print(f"  {label:52} {mb(m['rss']):7.1f} {'<= ' + str(WEB_TARGET_MB):>7} {mb(m['pss']):7.1f} {mb(m['uss']):7.1f}"
          f" {os.getloadavg()[0]:5.1f}", flush=True)


def web_load(box: BenchBox, n: int, task_id: str) -> None:
    """``n`` rounds of 5 API requests and 5 portal page loads (a signed-in session)."""
    portal = Portal(box.port)
    for i in range(n):
        box.get("/api/tasks?limit=50")
        box.get(f"/api/tasks/{task_id}")
        box.get(f"/api/tasks/{task_id}/events?after=0")
        box.get("/api/settings")
        box.get("/api/schema" if i % 10 == 0 else "/api/health")
        for page in ("/tasks", f"/tasks/{task_id}", "/inbox", "/settings", "/schedules"):
            portal.get(page)


def worker_memory(box: BenchBox, tasks: int) -> None:
    leader = box.procs[1].pid
    print(f"\n  {'cluster':28} {'role':9} {'pid':>8} {'RSS MB':>7} {'target':>7} {'PSS MB':>7} {'USS MB':>7} {'load':>5}")
    wait_idle([leader, *cluster_processes(leader)["sentinel"]])
    show_cluster("idle at start", leader)
    ids = [box.post("/api/tasks", {"title": f"memory {i}", "flow": TRIVIAL})["id"] for i in range(tasks)]
    wait_done(box, ids)
    family = cluster_processes(leader)
    wait_idle(family["worker"] + family["other"])
    show_cluster(f"idle after {tasks} tasks", leader)


def log_paging(box: BenchBox, count: int) -> None:
    small = box.post("/api/tasks", {"title": "a one-page log", "flow": TRIVIAL})["id"]
    big = box.post("/api/tasks", {"title": "a long log", "flow": TRIVIAL})["id"]
    wait_done(box, [small, big])
    box.manage("shell", "-c", FORGE_LOG.format(task_id=big, count=count))
    box.manage("shell", "-c", FORGE_LOG.format(task_id=small, count=PAGE))  # one page of each: the same page to draw
    last_seq = box.get(f"/api/tasks/{big}")["lastSeq"]
    # The actions' cursors: walk every page once, keep the middle one's and the last one's.
    cursors: list[str | None] = [None]
    while True:
        page = box.get(f"/api/tasks/{big}/actions?limit={PAGE}" + (f"&cursor={cursors[-1]}" if cursors[-1] else ""))
        if not page["next"]:
            break
        cursors.append(urllib.parse.quote(page["next"]))
    middle, last = cursors[len(cursors) // 2], cursors[-1]

    def actions(cursor: str | None, task: str = big) -> Callable[[], object]:
        return lambda: box.get(f"/api/tasks/{task}/actions?limit={PAGE}" + (f"&cursor={cursor}" if cursor else ""))

    def events(after: int, task: str = big) -> Callable[[], object]:
        return lambda: box.get(f"/api/tasks/{task}/events?after={after}&limit={PAGE}")

    portal = Portal(box.port)
    rows = [
        ("events: first page (after=0)", events(0), events(0, small)),
        (f"events: a middle page (after={last_seq // 2})", events(last_seq // 2), None),
        (f"events: the last page (after={last_seq - PAGE})", events(last_seq - PAGE), None),
        ("actions: first page", actions(None), actions(None, small)),
        (f"actions: a middle page ({len(cursors) // 2} of {len(cursors)})", actions(middle), None),
        (f"actions: the last page ({len(cursors)} of {len(cursors)})", actions(last), None),
        ("task window: its page (/tasks/<id>)", lambda: portal.get(f"/tasks/{big}"), lambda: portal.get(f"/tasks/{small}")),
        ("task window: its detail (/api/tasks/<id>)", lambda: box.get(f"/api/tasks/{big}"), lambda: box.get(f"/api/tasks/{small}")),
    ]
    print(f"\n  {f'paging a log of {last_seq} events, {count} actions':48} {'ms p50':>7} {'/ first':>8} {'1-page log ms':>13}"
          f" {'load':>5}   (pages of {PAGE}, median of {REPEAT})")
    first: dict[str, float] = {}
    for label, call, short in rows:
        ms = timed(call)
        kind = label.split(":")[0]
        first.setdefault(kind, ms)
        short_ms = f"{timed(short):13.1f}" if short else f"{'':13}"
        print(f"  {label:48} {ms:7.1f} {ms / first[kind]:8.2f} {short_ms} {os.getloadavg()[0]:5.1f}", flush=True)
    print("  (target: constant time, a page deep in the log or the last page about as fast as the first;"
          " each as fast as the same page of a one-page log)")


CONFIGS = {"embedded": ("embedded (SQLite, ORM queue)", False, False), "pg": ("PostgreSQL + Redis", True, True)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100, help="rounds of 5 API requests and 5 page loads")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--log", type=int, default=10_000, help="events (and actions) in the long log")
    parser.add_argument("--configs", default="embedded,pg")
    parser.add_argument("--recycle", help="BOX_WORKER_RECYCLE for the bench box (default: the box's own)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the box's processes")
    parser.add_argument("--paging-only", action="store_true", help="only the log's paging")
    args = parser.parse_args()
    extra = {"BOX_WORKER_RECYCLE": args.recycle} if args.recycle is not None else {}
    extra.update(item.split("=", 1) for item in args.env)
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    for name in args.configs.split(","):
        label, pg, redis = CONFIGS[name]
        print(f"\n{label} (2 workers; load: the 1-minute load average at each row)")
        with BenchBox(postgres=pg, redis=redis, cluster="runcluster", extra_env=extra) as box:
            if args.paging_only:
                log_paging(box, args.log)
                continue
            print(f"\n  {'web (daphne)':52} {'RSS MB':>7} {'target':>7} {'PSS MB':>7} {'USS MB':>7} {'load':>5}")
            web_row(box, "after start")
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.tasks + 10})
            worker_memory(box, args.tasks)
            seed = box.get("/api/tasks?limit=1")["results"][0]["id"]
            web_load(box, args.requests, seed)
            print(f"\n  {'web (daphne)':52} {'RSS MB':>7} {'target':>7} {'PSS MB':>7} {'USS MB':>7} {'load':>5}")
            web_row(box, f"after {args.tasks} tasks, {5 * args.requests} API requests, {5 * args.requests} page loads")
            log_paging(box, args.log)


if __name__ == "__main__":
    main()

"""POST /api/tasks -> first step started (p50/p95) and -> finished (p50), trivial tasks per second,
and flow steps per second within one task.

The box runs with its default queue poll, so the figures are what a default box gives.

Runs a real box (daphne + qcluster + scheduler) for the embedded default and for
PostgreSQL + Redis, and prints the figures beside the targets in docs/performance.md.
Usage: .venv/bin/python bench/dispatch.py [--latency N] [--throughput N] [--steps N] [--chain N]
Also the chained case: N trivial tasks chained by ``dependsOn`` (all posted at once), end to end,
beside the same N created one after another by a client.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox, percentile  # noqa: E402

TRIVIAL = {"steps": [{"write": {"path": "out.txt", "content": "x"}}]}


def first_step_latency(box: BenchBox, n: int) -> tuple[list[float], list[float]]:
    """POST -> first step started, and POST -> task finished, for ``n`` tasks one after another."""
    to_step, to_done = [], []
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
    return to_step, to_done


def throughput(box: BenchBox, n: int) -> float:
    start = time.time()
    ids = [box.post("/api/tasks", {"title": f"bulk {i}", "flow": TRIVIAL})["id"] for i in range(n)]
    pending = set(ids)
    while pending:
        page = box.get("/api/tasks?state=done&limit=200")
        done = {t["id"] for t in page["results"]}
        pending -= done
        if pending:
            time.sleep(0.05)
    return n / (time.time() - start)


def flow_steps(box: BenchBox, n: int) -> float:
    """Steps per second within one task: ``n`` write steps, first step started -> last finished."""
    flow = {"steps": [{"write": {"path": f"s{i}.txt", "content": str(i)}} for i in range(n)]}
    task = box.post("/api/tasks", {"title": "steps", "flow": flow})
    while not box.get(f"/api/tasks/{task['id']}")["finishedAt"]:
        time.sleep(0.05)
    events, after = [], 0
    while page := box.get(f"/api/tasks/{task['id']}/events?after={after}&limit=1000")["events"]:
        events += page
        after = page[-1]["seq"]
    steps = [datetime.fromisoformat(e["createdAt"]).timestamp() for e in events if e["kind"] == "step"]
    return (len(steps) - 1) / (steps[-1] - steps[0]) if len(steps) > 1 else float("nan")


def _wait_done(box: BenchBox, task_id: str) -> str:
    while not (finished := box.get(f"/api/tasks/{task_id}")["finishedAt"]):
        time.sleep(0.005)
    return str(finished)


def chained_by_depends_on(box: BenchBox, n: int) -> float:
    """``n`` trivial tasks, each depending on the one before, all posted at once: seconds from the
    first POST to the last task done. The box starts each as the one before ends."""
    start = time.time()
    previous: str | None = None
    ids = []
    for i in range(n):
        body: dict[str, object] = {"title": f"chain {i}", "flow": TRIVIAL}
        if previous:
            body["dependsOn"] = [previous]
        previous = box.post("/api/tasks", body)["id"]
        ids.append(previous)
    last = _wait_done(box, ids[-1])
    return datetime.fromisoformat(last).timestamp() - start


def chained_by_client(box: BenchBox, n: int) -> float:
    """The same ``n`` tasks, a client creating each after the one before finished."""
    start = time.time()
    last = ""
    for i in range(n):
        task = box.post("/api/tasks", {"title": f"client chain {i}", "flow": TRIVIAL})
        last = _wait_done(box, task["id"])
    return datetime.fromisoformat(last).timestamp() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=int, default=30)
    parser.add_argument("--throughput", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chain", type=int, default=40)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    print(f"\n{'configuration':40} {'p50 ms':>8} {'p95 ms':>8} {'target p50':>11} {'done p50':>9} {'tasks/s':>8} {'target':>7}"
          f" {'steps/s':>8} {'target':>7} {'load':>5}")
    for label, pg, redis, target in (("embedded (SQLite, ORM queue, polling)", False, False, 300),
                                     ("PostgreSQL + Redis", True, True, 100)):
        with BenchBox(postgres=pg, redis=redis) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.throughput + 10})
            lat, done = first_step_latency(box, args.latency)
            rate = throughput(box, args.throughput)
            steps = flow_steps(box, args.steps)
        p50, p95, done_p50 = percentile(lat, 50), percentile(lat, 95), percentile(done, 50)
        print(f"{label:40} {p50:8.0f} {p95:8.0f} {'<= ' + str(target):>11} {done_p50:9.0f} {rate:8.1f} {'>= 20':>7}"
              f" {steps:8.0f} {'>= 100':>7} {os.getloadavg()[0]:5.1f}", flush=True)
    print(f"\n({args.latency} sequential tasks for latency; {args.throughput} trivial flow tasks posted at once for throughput;"
          f" one task of {args.steps} write steps for steps/s; load: the 1-minute load average after each row)")
    print(f"\n{'configuration':40} {'dependsOn s':>12} {'client s':>9} {'target':>7}   ({args.chain} tasks chained)")
    for label, pg, redis in (("embedded (SQLite, ORM queue, polling)", False, False), ("PostgreSQL + Redis", True, True)):
        with BenchBox(postgres=pg, redis=redis) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.chain + 10})
            by_edges = chained_by_depends_on(box, args.chain)
            by_client = chained_by_client(box, args.chain)
        print(f"{label:40} {by_edges:12.1f} {by_client:9.1f} {'<= 2':>7}", flush=True)


if __name__ == "__main__":
    main()

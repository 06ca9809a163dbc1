"""POST /api/tasks -> first step started (p50/p95) and -> finished (p50), trivial tasks per second,
and flow steps per second within one task.

The box runs with its default queue poll, so the figures are what a default box gives.

Runs a real box (daphne + qcluster + scheduler) for the embedded default and for
PostgreSQL + Redis, and prints the figures beside the targets in docs/performance.md.
Usage: .venv/bin/python bench/dispatch.py [--latency N] [--throughput N] [--steps N] [--chain N]
[--configs embedded,pg] [--skip-chain]
Also the chained case: N trivial tasks chained by ``dependsOn`` (all posted at once), end to end,
beside the same N created one after another by a client; and where a trivial task's time goes,
phase by phase (medians of the latency tasks, and of the chain's links).
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


def chained_by_depends_on(box: BenchBox, n: int) -> tuple[float, list[dict[str, float]]]:
    """``n`` trivial tasks, each depending on the one before, all posted at once: seconds from the
    first POST to the last task done, and each link's marks from the moment the task before it
    finished. The box starts each as the one before ends."""
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
    links = [marks_of(box, later, _ts(box.get(f"/api/tasks/{earlier}")["finishedAt"]))
             for earlier, later in zip(ids, ids[1:], strict=False)]
    return datetime.fromisoformat(last).timestamp() - start, links


def chained_by_client(box: BenchBox, n: int) -> float:
    """The same ``n`` tasks, a client creating each after the one before finished."""
    start = time.time()
    last = ""
    for i in range(n):
        task = box.post("/api/tasks", {"title": f"client chain {i}", "flow": TRIVIAL})
        last = _wait_done(box, task["id"])
    return datetime.fromisoformat(last).timestamp() - start


CONFIGS = {"embedded": ("embedded (SQLite, ORM queue, polling)", False, False, 300),
           "pg": ("PostgreSQL + Redis", True, True, 100)}


def print_phases(title: str, tables: dict[str, list[tuple[str, float]]]) -> None:
    labels = list(tables)
    print(f"\n{title:58}" + "".join(f" {label:>12}" for label in labels))
    for i, (phase, _) in enumerate(next(iter(tables.values()))):
        print(f"{phase:58}" + "".join(f" {tables[label][i][1]:12.0f}" for label in labels))
    print(f"{'sum of medians':58}" + "".join(f" {sum(ms for _, ms in tables[label]):12.0f}" for label in labels))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=int, default=30)
    parser.add_argument("--throughput", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chain", type=int, default=40)
    parser.add_argument("--configs", default="embedded,pg", help="embedded, pg, or both (comma separated)")
    parser.add_argument("--skip-chain", action="store_true")
    args = parser.parse_args()
    configs = [CONFIGS[name] for name in args.configs.split(",")]
    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n{'configuration':40} {'p50 ms':>8} {'p95 ms':>8} {'target p50':>11} {'done p50':>9} {'tasks/s':>8} {'target':>7}"
          f" {'steps/s':>8} {'target':>7} {'load':>5}")
    phases: dict[str, list[tuple[str, float]]] = {}
    for label, pg, redis, target in configs:
        with BenchBox(postgres=pg, redis=redis) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.throughput + 10})
            lat, done, marks = first_step_latency(box, args.latency)
            rate = throughput(box, args.throughput)
            steps = flow_steps(box, args.steps)
        p50, p95, done_p50 = percentile(lat, 50), percentile(lat, 95), percentile(done, 50)
        phases[label.split(" ")[0]] = phase_table(marks)
        print(f"{label:40} {p50:8.0f} {p95:8.0f} {'<= ' + str(target):>11} {done_p50:9.0f} {rate:8.1f} {'>= 20':>7}"
              f" {steps:8.0f} {'>= 100':>7} {os.getloadavg()[0]:5.1f}", flush=True)
    print(f"\n({args.latency} sequential tasks for latency; {args.throughput} trivial flow tasks posted at once for throughput;"
          f" one task of {args.steps} write steps for steps/s; load: the 1-minute load average after each row)")
    print_phases("a trivial task, median ms per phase (latency tasks)", phases)
    if args.skip_chain:
        return
    print(f"\n{'configuration':40} {'dependsOn s':>12} {'client s':>9} {'target':>7} {'load':>5}   ({args.chain} tasks chained)")
    links: dict[str, list[tuple[str, float]]] = {}
    for label, pg, redis, _ in configs:
        with BenchBox(postgres=pg, redis=redis) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.chain + 10})
            by_edges, marks = chained_by_depends_on(box, args.chain)
            by_client = chained_by_client(box, args.chain)
        links[label.split(" ")[0]] = phase_table(marks)
        print(f"{label:40} {by_edges:12.1f} {by_client:9.1f} {'<= 2':>7} {os.getloadavg()[0]:5.1f}", flush=True)
    print_phases("a chain's link, median ms per phase (from the task before done)", links)
    print("(the first phase of a link: the dependency done -> its dependent's first run committed)")


if __name__ == "__main__":
    main()

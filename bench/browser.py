"""Browser steps: the cost of a task's own sandboxed browser against raw Playwright, in one run.

On one local page (a counter button, a text field, a table), beside raw Playwright launching the
same Chromium binary itself (no sandbox, no evidence, doing nothing but the call):

- start: the task's browser (Chromium in the task's sandbox, Playwright attached over CDP through
  the namespace relay), with the worker's Playwright driver already running and, once, with the
  driver started too; against ``launch`` + ``new_page`` (driver running) and the same with the
  driver's start;
- click, fill, extract: a step's duration as the task's log records it (the action, its
  evidence, its result event) against the bare call; raw also with the evidence a box step stores
  (a screenshot and the accessibility snapshot);
- click, fill in sequence: the wall clock of a task's run of N such steps, from the first one's
  start to the last one's evidence stored, over N (what the steps cost one after another, the
  worker's log writes between them included), against N bare calls in a row over N;
- evidence: a ``screenshot`` step (masked, stored) against a bare ``page.screenshot``;
- memory: the RSS of one browser's process tree (the box's parked at a payment checkpoint; raw
  launched), and of the Playwright driver process each side keeps;
- four tasks with a browser each at once (a box with four workers) against four raw threads:
  the wall clock from the first request to the last result, and the median click meanwhile.

Figures are medians of ``--rounds`` tasks (box) and as many raw browsers, alternating.
Usage: .venv/bin/python bench/browser.py [--rounds N] [--actions N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox, stop_on_signals  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402

PAGE = b"""<!doctype html><html><head><meta charset=utf-8><title>Counter</title></head><body>
<h1>Counter</h1><p id=n>0</p><button id=more>More</button>
<label>Name <input id=name></label>
<table id=fares><tr><th>Route</th><th>Fare</th></tr><tr><td>DEL-BOM</td><td>4321</td></tr><tr><td>DEL-BLR</td><td>5120</td></tr></table>
<script src=/counter.js></script></body></html>"""
SCRIPT = b"document.getElementById('more').addEventListener('click', () => { const n = document.getElementById('n'); n.textContent = String(Number(n.textContent) + 1); });"
CHROMIUM = "/usr/lib/chromium/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
TABLE_JS = "t => Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.innerText.trim()))"
CONCURRENT = 4


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body, kind = (SCRIPT, "text/javascript") if self.path == "/counter.js" else (PAGE, "text/html")
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


# -- memory ----------------------------------------------------------------------------------------
def _processes() -> dict[int, tuple[int, str, int]]:
    """pid -> (ppid, command line, RSS in kB) of every process."""
    found: dict[int, tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                status = dict(line.split(":", 1) for line in handle if ":" in line)
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rss = int(status.get("VmRSS", "0 kB").split()[0])
        found[int(entry)] = (int(status["PPid"]), cmdline, rss)
    return found


def tree_mb(marks: tuple[str, ...]) -> list[float]:
    """The RSS of each process tree whose root's command line holds every one of ``marks``."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    roots = [pid for pid, (ppid, cmd, _) in procs.items()
             if all(m in cmd for m in marks) and not all(m in procs.get(ppid, (0, "", 0))[1] for m in marks)]
    sizes = []
    for root in roots:
        total, todo = 0, [root]
        while todo:
            pid = todo.pop()
            total += procs[pid][2]
            todo.extend(children.get(pid, []))
        sizes.append(total / 1024)
    return sizes


# -- the box ---------------------------------------------------------------------------------------
def wait_done(box: BenchBox, task_id: str, *states: str) -> dict[str, Any]:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        view = box.get(f"/api/tasks/{task_id}")
        if view["state"] in states:
            return view
        time.sleep(0.1)
    raise RuntimeError(f"task {task_id} did not reach {states}")


def flow_steps(url: str, actions: int) -> list[dict[str, Any]]:
    return ([{"browse": url}] + [{"click": "#more"} for _ in range(actions)]
            + [{"fill": {"selector": "#name", "value": f"name {i}"}} for i in range(actions)]
            + [{"extract": {"selector": "#fares"}}, {"screenshot": {}}])


def box_task(box: BenchBox, url: str, actions: int) -> dict[str, Any]:
    task = box.post("/api/tasks", {"title": "browser bench", "hosts": ["127.0.0.1"], "flow": {"steps": flow_steps(url, actions)}})
    return task


def box_figures(box: BenchBox, task_id: str) -> dict[str, Any]:
    view = wait_done(box, task_id, "done", "failed", "cancelled")
    if view["state"] != "done":
        raise RuntimeError(f"the bench task ended {view['state']}: {view['error']}")
    events = box.get(f"/api/tasks/{task_id}/events?limit=1000")["events"]
    start = next(e["data"]["startMs"] for e in events if e["kind"] == "note" and e["data"].get("startMs") is not None)
    results = [e["data"] for e in events if e["kind"] == "step_result"]

    def of(kind: str) -> list[float]:
        return [r["durationMs"] for r in results if r["kind"] == kind]

    def sequence(kind: str) -> float:
        """From the first ``kind`` step's start to the last one's end (its evidence stored), over N."""
        mine = [r for r in results if r["kind"] == kind]
        first = datetime.fromisoformat(mine[0]["startedAt"])
        last = datetime.fromisoformat(mine[-1]["startedAt"]) + timedelta(milliseconds=mine[-1]["durationMs"])
        return (last - first).total_seconds() * 1000 / len(mine)

    return {"start": start, "click": of("click"), "fill": of("fill"), "extract": of("extract"), "evidence": of("screenshot"),
            "click_seq": [sequence("click")], "fill_seq": [sequence("fill")]}


def box_memory(box: BenchBox, url: str) -> float:
    """A browser parked at a payment checkpoint: its process tree, measured while it waits."""
    task = box.post("/api/tasks", {"title": "browser memory", "hosts": ["127.0.0.1"], "flow": {"steps": [
        {"browse": url}, {"click": "#more"}, {"checkpoint": {"reason": "pay", "payment": True}}]}})
    wait_done(box, task["id"], "waiting", "failed", "done")
    sizes = tree_mb(("box-browser", "--remote-debugging-port"))
    box.post(f"/api/tasks/{task['id']}/cancel", {})
    return max(sizes) if sizes else float("nan")


def driver_mb(ancestor_pids: list[int]) -> float:
    """The RSS of the Playwright driver processes below ``ancestor_pids`` (one per worker)."""
    procs = _processes()

    def below(pid: int) -> bool:
        while pid > 1:
            if pid in ancestor_pids:
                return True
            pid = procs.get(pid, (1, "", 0))[0]
        return False

    drivers = [rss for pid, (_, cmd, rss) in procs.items() if "run-driver" in cmd and below(pid)]
    return max(drivers) / 1024 if drivers else float("nan")


# -- raw Playwright --------------------------------------------------------------------------------
def raw_round(url: str, actions: int, *, started: bool = True, memory: bool = False) -> dict[str, Any]:
    """One browser: launch, the same actions, the bare calls timed (and each with the evidence)."""
    out: dict[str, Any] = {"click": [], "fill": [], "extract": [], "evidence": [], "with_evidence": [],
                           "click_seq": [], "fill_seq": []}
    began = time.perf_counter()
    with sync_playwright() as playwright:
        up = time.perf_counter()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        out["start"] = (time.perf_counter() - up) * 1000
        out["start_driver"] = (time.perf_counter() - began) * 1000
        page.goto(url)

        def timed(kind: str, act: Any) -> None:
            t = time.perf_counter()
            act()
            out[kind].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            evidence(page)
            out["with_evidence"].append(out[kind][-1] + (time.perf_counter() - t) * 1000)

        for _ in range(actions):
            timed("click", lambda: page.locator("#more").first.click())
        for i in range(actions):
            timed("fill", lambda i=i: page.locator("#name").first.fill(f"name {i}"))
        t = time.perf_counter()
        for _ in range(actions):
            page.locator("#more").first.click()
        out["click_seq"].append((time.perf_counter() - t) * 1000 / actions)
        t = time.perf_counter()
        for i in range(actions):
            page.locator("#name").first.fill(f"again {i}")
        out["fill_seq"].append((time.perf_counter() - t) * 1000 / actions)
        t = time.perf_counter()
        page.locator("#fares").first.evaluate(TABLE_JS)
        out["extract"].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        page.screenshot(type="png")
        out["evidence"].append((time.perf_counter() - t) * 1000)
        if memory:
            out["memory"] = max(tree_mb((CHROMIUM, "--remote-debugging-pipe")) or [float("nan")])
            out["driver"] = driver_mb([os.getpid()])
        browser.close()
    return out


def evidence(page: Page) -> None:
    page.screenshot(type="png")
    page.locator("body").aria_snapshot()


def raw_concurrent(url: str, actions: int) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: rounds.append(raw_round(url, actions))) for _ in range(CONCURRENT)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"wall": (time.perf_counter() - began) * 1000, "click": [c for r in rounds for c in r["click"]]}


def box_concurrent(box: BenchBox, url: str, actions: int) -> dict[str, Any]:
    began = time.perf_counter()
    tasks = [box_task(box, url, actions) for _ in range(CONCURRENT)]
    figures = [box_figures(box, t["id"]) for t in tasks]
    return {"wall": (time.perf_counter() - began) * 1000, "click": [c for f in figures for c in f["click"]]}


# -- report ----------------------------------------------------------------------------------------
def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5, help="tasks (and raw browsers) per figure")
    parser.add_argument("--actions", type=int, default=5, help="clicks and fills per task")
    args = parser.parse_args()
    stop_on_signals()
    load_before = os.getloadavg()[0]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    box_rounds: list[dict[str, Any]] = []
    raw_rounds: list[dict[str, Any]] = []
    try:
        with BenchBox(workers=CONCURRENT) as box:
            cold = box_figures(box, box_task(box, url, args.actions)["id"])  # this worker's first browser: its driver starts too
            box_parallel = box_concurrent(box, url, args.actions)  # every worker's driver is up after this
            raw_parallel = raw_concurrent(url, args.actions)
            for _ in range(args.rounds):
                box_rounds.append(box_figures(box, box_task(box, url, args.actions)["id"]))
                raw_rounds.append(raw_round(url, args.actions))
            memory = box_memory(box, url)
            box_driver = driver_mb([p.pid for p in box.procs])
            raw_memory = raw_round(url, 1, memory=True)
    finally:
        server.shutdown()

    def box_all(kind: str) -> float:
        return med([v for r in box_rounds for v in r[kind]])

    def raw_all(kind: str) -> float:
        return med([v for r in raw_rounds for v in r[kind]])

    print(f"browser steps on one local page (ms, medians of {args.rounds} tasks × {args.actions} actions; MB for memory)")
    print(f"load average (1 min): {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{'':<40} {'box':>9} {'raw':>9} {'box/raw':>8} {'raw + evidence':>15}")

    def row(name: str, boxed: float, raw: float, with_evidence: float | None = None) -> None:
        ratio = boxed / raw if raw else float("nan")
        extra = f"{with_evidence:>15.0f}" if with_evidence is not None else f"{'':>15}"
        print(f"{name:<40} {boxed:>9.0f} {raw:>9.0f} {ratio:>7.1f}× {extra}")

    row("start (driver running)", med([r["start"] for r in box_rounds]), med([r["start"] for r in raw_rounds]))
    row("start (driver starts too)", cold["start"], med([r["start_driver"] for r in raw_rounds]))
    row("click (step, with evidence)", box_all("click"), raw_all("click"), med([v for r in raw_rounds for v in r["with_evidence"][:args.actions]]))
    row("fill (step, with evidence)", box_all("fill"), raw_all("fill"), med([v for r in raw_rounds for v in r["with_evidence"][args.actions:]]))
    row(f"click in sequence ({args.actions} steps: wall / {args.actions})", box_all("click_seq"), raw_all("click_seq"),
        med([v for r in raw_rounds for v in r["with_evidence"][:args.actions]]))
    row(f"fill in sequence ({args.actions} steps: wall / {args.actions})", box_all("fill_seq"), raw_all("fill_seq"),
        med([v for r in raw_rounds for v in r["with_evidence"][args.actions:]]))
    row("extract (a table)", box_all("extract"), raw_all("extract"))
    row("evidence: a masked, stored screenshot", box_all("evidence"), raw_all("evidence"))
    row("memory: one browser's process tree (MB)", memory, raw_memory["memory"])
    row("memory: the Playwright driver (MB)", box_driver, raw_memory["driver"])
    row(f"{CONCURRENT} at once: wall, first request to last", box_parallel["wall"], raw_parallel["wall"])
    row(f"{CONCURRENT} at once: click (median)", med(box_parallel["click"]), med(raw_parallel["click"]))


if __name__ == "__main__":
    main()

"""Browser steps: the cost of a task's own sandboxed browser against raw Playwright.

Measures, on one local page: starting the browser for a task (Chromium in the task's sandbox,
Playwright attached over CDP through the namespace relay) against Playwright launching Chromium
itself; the per-step time of `browse` and `click` in a flow against the same calls in raw
Playwright; and what the evidence of one acting step costs (two screenshots and the
accessibility snapshot), measured in raw Playwright.
Usage: .venv/bin/python bench/browser.py [--clicks N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox, stop_on_signals  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

PAGE = b"""<!doctype html><html><head><meta charset=utf-8><title>Counter</title></head><body>
<h1>Counter</h1><p id=n>0</p><button id=more>More</button>
<script src=/counter.js></script></body></html>"""
SCRIPT = b"document.getElementById('more').addEventListener('click', () => { const n = document.getElementById('n'); n.textContent = String(Number(n.textContent) + 1); });"
CHROMIUM = "/usr/lib/chromium/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


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


def box_figures(box: BenchBox, url: str, clicks: int) -> dict[str, float]:
    steps: list[dict[str, Any]] = [{"browse": url}] + [{"click": "#more"} for _ in range(clicks)] + [{"browse": url}]
    task = box.post("/api/tasks", {"title": "browser bench", "hosts": ["127.0.0.1"], "flow": {"steps": steps}})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        view = box.get(f"/api/tasks/{task['id']}")
        if view["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.2)
    if view["state"] != "done":
        raise RuntimeError(f"the bench task ended {view['state']}: {view['error']}")
    events = box.get(f"/api/tasks/{task['id']}/events?limit=1000")["events"]
    start = next(e["data"]["startMs"] for e in events if e["kind"] == "note" and e["data"].get("browser"))
    results = [e["data"] for e in events if e["kind"] == "step_result"]
    clicks_ms = [r["durationMs"] for r in results if r["kind"] == "click"]
    browse_ms = results[-1]["durationMs"]  # the second browse: the browser is already up
    return {"start": start, "browse": browse_ms, "click": statistics.median(clicks_ms)}


def raw_figures(url: str, clicks: int) -> dict[str, float]:
    with sync_playwright() as playwright:
        began = time.monotonic()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        start = (time.monotonic() - began) * 1000
        page.goto(url)
        began = time.monotonic()
        page.goto(url, wait_until="load")
        browse = (time.monotonic() - began) * 1000
        times = []
        for _ in range(clicks):
            began = time.monotonic()
            page.locator("#more").first.click()
            times.append((time.monotonic() - began) * 1000)
        evidence = []
        for _ in range(clicks):
            began = time.monotonic()
            page.screenshot(type="png")
            page.locator("body").aria_snapshot()
            page.screenshot(type="png")
            evidence.append((time.monotonic() - began) * 1000)
        browser.close()
    return {"start": start, "browse": browse, "click": statistics.median(times), "evidence": statistics.median(evidence)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clicks", type=int, default=10)
    args = parser.parse_args()
    stop_on_signals()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        raw = raw_figures(url, args.clicks)
        with BenchBox() as box:
            boxed = box_figures(box, url, args.clicks)
    finally:
        server.shutdown()
    print(f"browser steps on one local page (milliseconds; clicks: median of {args.clicks})")
    print(f"{'':<34} {'box (sandboxed, with evidence)':>31} {'raw Playwright':>15}")
    print(f"{'start a browser':<34} {boxed['start']:>31.0f} {raw['start']:>15.0f}")
    print(f"{'browse (page already open)':<34} {boxed['browse']:>31.0f} {raw['browse']:>15.0f}")
    print(f"{'click':<34} {boxed['click']:>31.0f} {raw['click']:>15.0f}")
    print(f"{'evidence: 2 screenshots + snapshot':<34} {'(in the rows above)':>31} {raw['evidence']:>15.0f}")


if __name__ == "__main__":
    main()

"""Task starts under sustained load: N sandboxed tasks while busy loops hold the load average up.

Each task's start makes a user, an id-mapped view and fresh namespaces: the steps that raced under
load (the id-map written before the namespace existed). Prints how many tasks ended done and the
load average seen; every task done is the bar.
Usage: .venv/bin/python bench/start_load.py [--tasks N] [--burners B] [--postgres]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox  # noqa: E402

FLOW = {"steps": [{"write": {"path": "in.txt", "content": "x"}}, {"run": "cat in.txt > out.txt"}]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--burners", type=int, default=8)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--deadline", type=float, default=1800.0)
    args = parser.parse_args()
    burners = [subprocess.Popen(["nice", "-n", "19", "sh", "-c", "while :; do :; done"]) for _ in range(args.burners)]
    loads: list[float] = []
    try:
        with BenchBox(postgres=args.postgres, redis=args.postgres) as box:
            box.request("PATCH", "/api/settings", {"maxActiveTasks": args.tasks + 10})
            ids = [box.post("/api/tasks", {"title": f"load {n}", "flow": FLOW})["id"] for n in range(args.tasks)]
            states: dict[str, str] = {}
            end = time.monotonic() + args.deadline
            while time.monotonic() < end:
                loads.append(os.getloadavg()[0])
                states = {t: box.get(f"/api/tasks/{t}")["state"] for t in ids}
                if not any(s in ("queued", "running", "waiting") for s in states.values()):
                    break
                time.sleep(2)
            errors = {box.get(f"/api/tasks/{t}")["error"] for t, s in states.items() if s == "failed"}
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    done = sum(s == "done" for s in states.values())
    print(f"\n{'tasks':>6} {'done':>6} {'failed':>6} {'unfinished':>10} {'load min':>8} {'load max':>8}")
    print(f"{args.tasks:6} {done:6} {sum(s == 'failed' for s in states.values()):6} "
          f"{sum(s in ('queued', 'running', 'waiting') for s in states.values()):10} {min(loads):8.1f} {max(loads):8.1f}")
    for error in sorted(errors):
        print("  failed:", error)


if __name__ == "__main__":
    main()

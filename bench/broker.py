"""Broker round trips from inside a task: `box step` and `box tool`, beside their floor.

The floor is starting the system python3 alone (every `box` call is one short-lived process);
the rest is the socket round trip plus the lease-checked write of the event(s).
Usage: .venv/bin/python bench/broker.py [--calls N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchBox  # noqa: E402

SCRIPT = """
n={n}
now() {{ date +%s%N; }}
t0=$(now); i=0; while [ $i -lt $n ]; do /usr/bin/python3 -c pass; i=$((i+1)); done
t1=$(now); i=0; while [ $i -lt $n ]; do box step "step $i"; i=$((i+1)); done
t2=$(now); i=0; while [ $i -lt $n ]; do box tool notify.owner --args '{{"message": "m"}}' >/dev/null; i=$((i+1)); done
t3=$(now)
echo "RESULT floor=$(( (t1-t0)/n/1000 )) step=$(( (t2-t1)/n/1000 )) tool=$(( (t3-t2)/n/1000 ))"
"""


def measure(box: BenchBox, calls: int) -> tuple[int, int, int]:
    task = box.post("/api/tasks", {"title": "broker bench", "worker": "command", "prompt": "bench",
                                   "tools": ["notify.owner"], "limits": {"max_actions": calls + 1},
                                   "command": ["/bin/sh", "-c", SCRIPT.format(n=calls)]})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        view = box.get(f"/api/tasks/{task['id']}")
        if view["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.2)
    if view["state"] != "done":
        raise RuntimeError(f"the bench task ended {view['state']}: {view['error']}")
    after, line = 0, None
    while True:
        page = box.get(f"/api/tasks/{task['id']}/events?after={after}&limit=1000")
        for event in page["events"]:
            if event["kind"] == "output" and event["summary"].startswith("RESULT "):
                line = event["summary"]
        if not page["more"]:
            break
        after = page["nextAfter"]
    assert line is not None, "the bench task printed no RESULT line"
    # key=value, not bare numbers: a row of digits can look like a card number to the redactor
    floor, step, tool = (int(x.split("=")[1]) for x in line.split()[1:])
    return floor, step, tool


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    rows = []
    for label, pg in (("embedded (SQLite)", False), ("PostgreSQL", True)):
        with BenchBox(postgres=pg) as box:
            rows.append((label, *measure(box, args.calls)))
    print(f"broker round trips from inside a task, mean of {args.calls} calls each (microseconds per call)")
    print(f"{'configuration':<22} {'python3 -c pass (floor)':>24} {'box step':>10} {'box tool notify.owner':>22}")
    for label, floor, step, tool in rows:
        print(f"{label:<22} {floor:>24} {step:>10} {tool:>22}")


if __name__ == "__main__":
    main()

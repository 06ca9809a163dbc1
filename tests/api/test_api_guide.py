"""The API guide's Python example runs as written: its block is taken from
``docs/reference/api.md`` (the one ``python`` block under "A first task, end to end") and run as
a program of its own against a real box (``tests.live_box``), with nothing changed but where the
box is. It creates a task that asks for an OK, follows it over the WebSocket, approves it, and
prints the outcome; the test holds the box to what it printed."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.live_box import LiveBox, live_box

__all__ = ["live_box"]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "api.md"
HEADING = "## A first task, end to end"
BOX_LINE = 'BOX = "http://127.0.0.1:8000"'


def example() -> str:
    """The Python block of the guide's first section (up to the next heading)."""
    text = GUIDE.read_text()
    assert HEADING in text, f"{GUIDE.name} has no '{HEADING}' section"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert len(blocks) == 1, f"'{HEADING}' holds {len(blocks)} python blocks, not one"
    return str(blocks[0])


def get(box: LiveBox, path: str) -> Any:
    request = urllib.request.Request(box.url + path, headers={"Authorization": f"Bearer {box.token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_the_guides_python_example_creates_follows_approves_and_reads_a_task(live_box: LiveBox) -> None:
    code = example()
    assert code.count(BOX_LINE) == 1, "the example names the box in one line the test can point elsewhere"
    env = {**os.environ, "BOX_TOKEN": live_box.token}
    run = subprocess.run([sys.executable, "-c", code.replace(BOX_LINE, f"BOX = {live_box.url!r}")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout.splitlines()
    assert printed[-2:] == ["done None None None", "['hello.txt']"], run.stdout

    [task] = get(live_box, "/api/tasks")["results"]
    assert (task["title"], task["state"]) == ("Write a greeting", "done")
    [approval] = get(live_box, f"/api/tasks/{task['id']}")["approvals"]
    assert (approval["state"], approval["decidedVia"]) == ("approved", "api")
    # Every event of the log was printed once, in order, as "<seq> <summary>".
    events = get(live_box, f"/api/tasks/{task['id']}/events?limit=1000")["events"]
    streamed = printed[:-2]
    assert streamed == [f"{event['seq']} {event['summary']}" for event in events][:len(streamed)]
    assert len(streamed) >= 3 and any("waiting" in line for line in streamed), run.stdout
    assert get(live_box, "/api/workspaces/home/files?path=hello.txt")["content"] == "hello\n"

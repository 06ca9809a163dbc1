"""The API guide's Python example runs as written: its block is taken from
``docs/reference/api.md`` (the one ``python`` block under "A first task, end to end") and run as
a program of its own against a real box (``tests.live_box``), with nothing changed but where the
box is. It creates a task that asks for an OK, follows it over the WebSocket, approves it, and
prints the outcome; the test holds the box to what it printed."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from approvals.models import Approval
from tasks.models import Task
from tests.conftest import wait_for
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


def test_the_example_answers_a_pause_once_while_the_worker_is_slow_to_take_it_on(live_box: LiveBox, tmp_path: Path) -> None:
    """After the OK the task still says waiting (nothing pending) until a worker takes it on, and
    a frame of that moment reaches the example. Held in place: the example is stopped until the
    task waits and the worker is gone, and the worker comes back only once the example printed
    the decision, so that frame always arrives first. An example that took it for a new question
    would OK again and get a 409."""
    code = example().replace(BOX_LINE, f"BOX = {live_box.url!r}")
    env = {**os.environ, "BOX_TOKEN": live_box.token, "PYTHONUNBUFFERED": "1"}
    errors = tmp_path / "example.err"  # a file, not a pipe: a long traceback never blocks the example
    with errors.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    try:
        wait_for(lambda: Task.objects.exists(), interval=0.002, what="the example to create its task")
        proc.send_signal(signal.SIGSTOP)
        task = Task.objects.get()
        wait_for(lambda: Task.objects.filter(pk=task.pk, state="waiting").exists(), what="the task to wait")
        live_box.stop_worker()
        proc.send_signal(signal.SIGCONT)
        reader.start()
        wait_for(lambda: any("approved (api)" in line for line in lines), what="the example to approve")
        live_box.start_worker()
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, errors.read_text()[-3000:]
    reader.join(timeout=10)
    assert lines[-2:] == ["done None None None\n", "['hello.txt']\n"], lines
    assert [a.state for a in Approval.objects.filter(task=task)] == ["approved"]

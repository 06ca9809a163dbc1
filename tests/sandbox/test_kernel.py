"""Attacks on the kernel's shared state from inside a task: the process list, keyrings, the host's
files and mount table, system calls. Each test performs the attack and fails if it succeeds."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from tests.conftest import wait_for
from tests.factories import flow
from tests.sandbox.conftest import needs_sandbox

pytestmark = needs_sandbox

SECRET = "hunter2-cmdline-canary-5150"
MARKER = "1000987"  # sleep's argument: how the test finds the running step


def _cmdlines() -> dict[int, bytes]:
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
    return found


def test_a_secret_in_a_run_step_is_in_no_process_command_line(sandboxed):
    seen: dict[str, object] = {}

    def watch() -> None:
        # While the step runs (its sleep is up only if the secret reached the script intact),
        # read every command line on the machine, then end the step.
        def step_running() -> int | None:
            return next((pid for pid, line in _cmdlines().items() if line == f"sleep\0{MARKER}\0".encode()), None)

        pid = wait_for(step_running, timeout=60, what="the run step's sleep")
        seen["leaks"] = [line for line in _cmdlines().values() if SECRET.encode() in line]
        seen["scanned"] = True
        os.kill(pid, signal.SIGKILL)

    watcher = threading.Thread(target=watch)
    watcher.start()
    task = sandboxed.create(title="secret step", facts={"password": SECRET}, flow=flow(
        {"run": f'test "${{password}}" = "{SECRET}" && exec sleep {MARKER}'},
    ))
    watcher.join(timeout=90)
    sandboxed.wait_state(task["id"], "failed", "done")
    assert seen.get("scanned"), "the step never ran with the secret"
    assert seen["leaks"] == []


def test_a_run_step_still_runs_its_shell_script(sandboxed):
    task = sandboxed.create(title="script", facts={"password": SECRET}, flow=flow(
        {"run": f'set -e\nx="${{password}}"\ncd /tmp && printf %s "$x" > got\ntest "$(cat got)" = "{SECRET}"'},
    ))
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view

"""A run's commands are forked by one resident init (``tasks.sandbox.resident``): each still has
its own processes and scratch space, dies whole with its step, and nothing of the run outlives it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tasks.sandbox import accounts, resident
from tasks.workers import process
from tests.factories import flow
from tests.pauses.helpers import report
from tests.sandbox.conftest import needs_sandbox, uid_of

pytestmark = needs_sandbox

# Step 1 leaves a double-forked daemon, a file in each scratch directory, and a SysV message queue.
LEAVES = ("sh -c 'setsid sleep 1001 </dev/null >/dev/null 2>&1 &'; "
          "for d in /tmp /var/tmp /dev/shm /run; do echo left > $d/left; done; echo $$")
# Step 2 says what it sees of step 1.
LOOKS = ("echo pid=$$; echo procs=$(ls -d /proc/[0-9]* | wc -l); "
         "echo sleeping=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 100[1]'); "
         "echo left=$(ls /tmp /var/tmp /dev/shm /run | grep -c left); echo mounts=$(wc -l < /proc/self/mountinfo)")


def _cmdlines(uid: int) -> list[str]:
    found = []
    for pid in accounts.running_processes_of(uid):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass  # gone meanwhile
    return found


def _after_each_step(monkeypatch: Any, task_holder: dict[str, str]) -> list[list[str]]:
    """The task user's processes (their command lines) the moment each step's wait returns."""
    seen: list[list[str]] = []
    wait = process.wait

    def watched(ctx: Any, proc: Any, **kwargs: Any) -> process.Finished:
        done = wait(ctx, proc, **kwargs)
        uid = uid_of(ctx.task.pk)
        assert uid is not None
        seen.append(_cmdlines(uid))
        task_holder["id"] = ctx.task.pk
        return done

    monkeypatch.setattr(process, "wait", watched)
    return seen


def test_a_commands_daemon_dies_with_its_step_and_the_next_sees_nothing_of_it(sandboxed, monkeypatch):
    holder: dict[str, str] = {}
    seen = _after_each_step(monkeypatch, holder)
    task = sandboxed.create(title="two commands", flow=flow({"run": LEAVES, "save": "first"}, {"run": LOOKS, "save": "second"},
                                                            {"run": LOOKS, "save": "third"}))
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    assert len(seen) == 3
    assert not [line for line in seen[0] if "sleep 1001" in line], seen[0]  # gone the moment its step ended
    records = report(sandboxed, task["id"])["records"]
    second = dict(line.split("=", 1) for line in records["second"].splitlines())
    third = dict(line.split("=", 1) for line in records["third"].splitlines())
    assert records["first"].strip() == "2" == second["pid"]  # each shell is PID 2: init, then it
    assert second["sleeping"] == "0" and second["left"] == "0", second
    assert int(second["procs"]) <= 6, second  # its init, the shell, the substitution's subshell and its pipeline
    assert second["mounts"] == third["mounts"]  # every command gets the same root, not one more layer each


def test_a_run_uses_one_init_for_its_commands_and_leaves_no_process_behind(sandboxed, monkeypatch):
    started: list[resident.ResidentInit] = []
    start = resident.ResidentInit.start

    def counted(config: dict[str, Any], passed: tuple[int, ...]) -> resident.ResidentInit:
        init = start(config, passed)
        started.append(init)
        return init

    monkeypatch.setattr(resident.ResidentInit, "start", staticmethod(counted))
    task = sandboxed.create(title="three commands", flow=flow({"run": "true"}, {"run": "true"}, {"run": "echo done"}))
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    assert len(started) == 1
    init = started[0]
    assert init.proc.returncode == 0  # the run's end let it go, and it left by itself
    assert not os.path.exists(f"/proc/{init.proc.pid}")


def test_a_command_killed_at_its_timeout_takes_what_it_started_and_the_run_goes_on(sandboxed, monkeypatch):
    holder: dict[str, str] = {}
    seen = _after_each_step(monkeypatch, holder)
    task = sandboxed.create(title="timeout", flow=flow(
        {"run": "sh -c 'setsid sleep 1003 </dev/null >/dev/null 2>&1 &'; exec sleep 1004", "timeout_s": 1},
    ))
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed" and "timed out" in (view.get("error") or ""), view
    assert not [line for line in seen[0] if "sleep 100" in line], seen[0]
    again = sandboxed.create(title="after", flow=flow({"run": "echo fine", "save": "out"}))
    assert sandboxed.wait_state(again["id"], "done", "failed")["state"] == "done"
    assert report(sandboxed, again["id"])["records"]["out"] == "fine"

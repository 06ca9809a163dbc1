"""A killed worker takes its task's processes with it: the interrupted step does not finish on
its own and then run again in the retry, and the log says which step was interrupted."""
from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from boxsite.core import procs
from tasks.layers import paths as layer_paths
from tasks.models import Run, Task
from tasks.run import leases as runs
from tasks.run import receipts as step_receipts
from tasks.sandbox import accounts, users
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow

pytestmark = pytest.mark.usefixtures("cluster_mode")

# The first attempt marks itself and then works for 2 s; any attempt that gets to the end of the
# step appends a line to effects.txt (the "paid call"). The last step reports the lines.
SLOW_EFFECT = flow(
    {"run": "if [ -f .attempted ]; then echo again; else touch .attempted; sleep 2; fi; echo effect >> effects.txt",
     "name": "paid call"},
    {"run": "cat effects.txt", "save": "effects"},
)


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)
    settings.BOX_MAX_RUN_ATTEMPTS = 3


def _mid_step(task_id: str) -> Run | None:
    run = Run.objects.filter(task_id=task_id, number=1, state="running").first()
    if run is None or not run.worker_pid:
        return None
    return run if Task.objects.get(pk=task_id).step.startswith("step 1/2") else None


def _task_processes(task_id: str) -> list[str]:
    """The live processes of the task's user (zombies are dead already), as "pid state cmdline"."""
    ident = users.find_user(task_id)
    found = []
    for pid in [] if ident is None else accounts.processes_of(ident.uid):
        state = procs.state(pid)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state not in (None, "Z"):
            found.append(f"{pid} {state} {cmdline}")
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (task users) needs root")
def test_a_killed_workers_step_dies_with_it_and_runs_exactly_once_more(box, tmp_path):
    with running_box(tmp_path):
        task = box.create(title="paid once", flow=SLOW_EFFECT)
        first = wait_for(lambda: _mid_step(task["id"]), timeout=60, what="the first run to be mid-step")
        wait_for(lambda: _task_processes(task["id"]), timeout=10, what="the step's processes to start")
        os.kill(first.worker_pid, signal.SIGKILL)
        # Well before the step's 2 s are up, nothing of the task runs any more.
        try:
            wait_for(lambda: not _task_processes(task["id"]), timeout=1.0, interval=0.02,
                     what="the task's processes to die with their worker")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {_task_processes(task['id'])}") from None
        view = box.wait_state(task["id"], "done", "failed", timeout=90)
    assert view["state"] == "done", view
    # The step's effect happened once: the killed attempt never got to the end of it.
    assert Task.objects.get(pk=task["id"]).records["effects"] == "effect"
    notes = [e for e in box.events(task["id"]) if e["kind"] == "note"]
    interrupted = [e for e in notes if e["data"].get("interrupted")]
    assert len(interrupted) == 1, notes
    assert "step 1/2" in interrupted[0]["summary"] and "paid call" in interrupted[0]["summary"]
    assert interrupted[0]["data"]["step"] == 1  # the same number as "step 1/2"


# The step's last action is its effect, once the test says go; then its process exits.
EFFECT_LAST = flow(
    {"run": "while [ ! -e go ]; do sleep 0.02; done; echo effect >> effects.txt", "name": "paid call"},
    {"run": "cat effects.txt", "save": "effects"},
)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (task users) needs root")
def _killed_after_the_receipt(box: Any, tmp_path: Path, title: str, damage: Callable[[Path], None] | None = None
                              ) -> tuple[dict[str, Any], Path]:
    """A task whose worker dies after the first step's process ended and its receipt was written,
    before the result is recorded (``damage``, if given, is done to the receipt meanwhile); the
    task once it ended, and where the receipt was."""
    with running_box(tmp_path):
        task = box.create(title=title, flow=EFFECT_LAST)
        first = wait_for(lambda: _mid_step(task["id"]), timeout=60, what="the first run to be mid-step")
        receipt = step_receipts.path_of(task["id"], 0)
        # Holding the task's row keeps the worker from recording anything: the step's process
        # ends (its effect done), its receipt is written, and the worker waits to record the
        # result. That is where it dies.
        with transaction.atomic():
            runs.lock_task(task["id"])
            (layer_paths.view_dir(task["id"]) / "go").touch()
            wait_for(lambda: _ended(receipt), timeout=30, interval=0.01, what="the step's receipt to say how it ended")
            os.kill(first.worker_pid, signal.SIGKILL)
            if damage is not None:
                damage(receipt)
        return box.wait_state(task["id"], "done", "failed", timeout=90), receipt


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (task users) needs root")
def test_a_worker_killed_after_its_step_ended_but_before_recording_it_does_not_run_the_step_again(box, tmp_path):
    view, receipt = _killed_after_the_receipt(box, tmp_path, "paid once, recorded late")
    assert view["state"] == "done", view
    events = box.events(view["id"])
    assert Task.objects.get(pk=view["id"]).records["effects"] == "effect"  # the effect happened once
    results = [e for e in events if e["kind"] == "step_result" and e["data"]["step"] == 1]
    assert len(results) == 1, results
    assert "recorded after a restart from the step's receipt" in results[0]["summary"], results[0]
    assert results[0]["data"]["exitCode"] == 0 and results[0]["data"]["receiptRun"] == 1
    starts = [e for e in events if e["kind"] == "step" and e["data"]["step"] == 1]
    assert len(starts) == 1, starts  # not started again
    assert not [e for e in events if e["kind"] == "note" and e["data"].get("interrupted")]
    assert not receipt.exists()  # gone once the log has the result


def _ended(receipt: Path) -> bool:
    """The receipt has its second line: how the process ended."""
    return receipt.exists() and len(receipt.read_text().splitlines()) == 2


def _without_exit_code(receipt: Path) -> None:
    header, ending = (json.loads(line) for line in receipt.read_text().splitlines())
    del ending["code"]
    receipt.write_text(json.dumps(header) + "\n" + json.dumps(ending) + "\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (task users) needs root")
def test_a_receipt_not_in_the_shape_the_worker_writes_is_no_receipt_and_the_step_runs_again(box, tmp_path):
    view, receipt = _killed_after_the_receipt(box, tmp_path, "recorded late, receipt damaged", _without_exit_code)
    assert view["state"] == "done", view
    # Nothing says how the first attempt ended: the step ran again, as one cut off mid-way does.
    assert Task.objects.get(pk=view["id"]).records["effects"] == "effect\neffect"
    results = [e for e in box.events(view["id"]) if e["kind"] == "step_result" and e["data"]["step"] == 1]
    assert len(results) == 1 and not results[0]["data"].get("fromReceipt"), results
    assert not receipt.exists()


# The step's effect is its last action; its process then exits.
EFFECT_THEN_EXIT = flow(
    {"run": "echo effect >> effects.txt", "name": "paid call"},
    {"run": "cat effects.txt", "save": "effects"},
)


def _command_exited(task_id: str) -> bool:
    """The step's effect is done and its command is gone: only the sandbox's init is left."""
    effects = layer_paths.view_dir(task_id) / "effects.txt"
    left = _task_processes(task_id)
    return effects.exists() and bool(left) and all("init.py" in line for line in left)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (task users) needs root")
@pytest.mark.parametrize("instant", ["init", "exited", "recording"])
def test_a_worker_killed_at_any_instant_after_its_steps_process_exited_does_not_run_the_step_again(box, tmp_path, instant):
    """``init``: after the exit, before the receipt's ending is written (init holds there until
    the worker is gone); ``exited``: the worker learnt of the exit; ``recording``: the output is
    saved as artifacts, the database write not yet made."""
    with running_box(tmp_path, BOX_TEST_HOLD=instant):
        task = box.create(title=f"paid once, killed at {instant}", flow=EFFECT_THEN_EXIT)
        marker = step_receipts.held_marker(task["id"], instant)
        wait_for(marker.exists, timeout=60, interval=0.02, what=f"the worker to hold at {instant}")
        first = Run.objects.get(task_id=task["id"], number=1)
        if instant == "init":
            wait_for(lambda: _command_exited(task["id"]), timeout=30, interval=0.02, what="the step's command to exit")
        os.kill(first.worker_pid, signal.SIGKILL)
        view = box.wait_state(task["id"], "done", "failed", timeout=90)
    assert view["state"] == "done", view
    assert Task.objects.get(pk=task["id"]).records["effects"] == "effect"  # the effect happened once
    events = box.events(task["id"])
    results = [e for e in events if e["kind"] == "step_result" and e["data"]["step"] == 1]
    assert len(results) == 1 and results[0]["data"]["fromReceipt"] and results[0]["data"]["exitCode"] == 0, results
    assert not [e for e in events if e["kind"] == "note" and e["data"].get("interrupted")]
    assert Run.objects.get(task_id=task["id"], number=1).state == "lost"
    assert not step_receipts.path_of(task["id"], 0).exists()


COMMAND_EFFECT = ["/bin/sh", "-c", "echo effect >> effects.txt; echo said it"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox (task users) needs root")
def test_a_command_worker_killed_after_its_process_exited_does_not_start_it_again(box, tmp_path):
    with running_box(tmp_path, BOX_TEST_HOLD="exited"):
        task = box.create(title="command once", prompt="say it once", worker="command", command=COMMAND_EFFECT)
        wait_for(step_receipts.held_marker(task["id"], "exited").exists, timeout=60, interval=0.02,
                 what="the worker to hold after the exit")
        os.kill(Run.objects.get(task_id=task["id"], number=1).worker_pid, signal.SIGKILL)
        view = box.wait_state(task["id"], "done", "failed", timeout=90)
    assert view["state"] == "done", view
    events = box.events(task["id"])
    assert len([e for e in events if e["kind"] == "step"]) == 1  # started once
    results = [e for e in events if e["kind"] == "step_result"]
    assert len(results) == 1 and results[0]["data"]["fromReceipt"], results
    assert "said it" in results[0]["data"]["stdout"]

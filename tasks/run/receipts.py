"""A ``run`` step's receipt: how its process ended, kept before anything else is done with it.

Without it, a worker killed after a step's process exited and before the step's result was recorded
would run the step again: nothing would tell that kill apart from one in the middle of the step.
The worker writes the receipt the moment the process's exit and output are in hand (before the
output becomes artifacts, before the database): the exit code, the output's tails, and links to the
spool files holding the whole output, with their sizes. It lives in the task's spool directory,
which is the box's (mode 0700, root's): the task's user can neither write nor forge one.

A retry that finds a complete receipt for the step it resumes at, written by an earlier run of
the same task that was lost, records the step's result from it instead of running the step again.
Complete means: the file parses, names this task, this step and an earlier run of this task
that was lost, and every spool file it names is there with the size it names (the
receipt is written by rename after them, so a receipt is never half there). A receipt goes once
the step's result is recorded, so one that is left names a result the log does not have. Anything
else is no receipt: the step runs again, as a step cut off mid-way does, and the log says it was interrupted.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.models import Run, RunState
from tasks.run import artifacts

if TYPE_CHECKING:
    from tasks.run.context import RunContext
    from tasks.workers.process import Finished


@dataclass
class Receipt:
    run_number: int
    name: str  # the spool's name (``step-N-run-M``), so its artifacts keep their names
    code: int
    stdout: str
    stderr: str
    timed_out: bool
    spool: tuple[Path, Path]


STREAMS = ("stdout", "stderr")


def path_of(task_id: str, index: int) -> Path:
    return artifacts.spool_dir(task_id) / f"step-{index + 1}.receipt.json"


def write(ctx: RunContext, index: int, name: str, done: Finished, spool: tuple[Path, Path]) -> None:
    """Keep how step ``index``'s process ended. Call as soon as ``process.wait`` returns."""
    target = path_of(ctx.task.pk, index)
    kept = []
    for stream, path in zip(STREAMS, spool):
        # A link of its own: turning the spool into artifacts removes the spool's names.
        link = _output_of(ctx.task.pk, index, stream)
        link.unlink(missing_ok=True)
        if path.exists():
            os.link(path, link)
        kept.append({"path": link.name, "size": link.stat().st_size if link.exists() else None})
    body = {
        "task": ctx.task.pk, "step": index + 1, "run": ctx.run.pk, "runNumber": ctx.run.number, "name": name,
        "code": done.code, "timedOut": done.timed_out, "stdout": done.stdout, "stderr": done.stderr, "spool": kept,
    }
    partial = target.with_suffix(".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(body, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, target)


def discard(task_id: str, index: int) -> None:
    path_of(task_id, index).unlink(missing_ok=True)
    for stream in STREAMS:
        _output_of(task_id, index, stream).unlink(missing_ok=True)


def _output_of(task_id: str, index: int, stream: str) -> Path:
    return artifacts.spool_dir(task_id) / f"step-{index + 1}.receipt.{stream}"


def find(ctx: RunContext, index: int) -> Receipt | None:
    """The complete receipt of step ``index`` left by a lost earlier run of this task, or None
    (an incomplete or foreign one is removed: the step runs again)."""
    body = _read(ctx.task.pk, index)
    if body is None:
        return None
    run_id = body.get("run")
    run = Run.objects.filter(pk=run_id, task_id=ctx.task.pk).first() if isinstance(run_id, int) else None
    receipt = None
    if run is not None and run.state == RunState.LOST and run.number < ctx.run.number and body.get("runNumber") == run.number:
        try:
            receipt = _complete(ctx.task.pk, run, body)
        except (AttributeError, KeyError, TypeError, ValueError):
            receipt = None  # not the shape ``write`` leaves: not a receipt
    if receipt is None:
        discard(ctx.task.pk, index)
    return receipt


def _complete(task_id: str, run: Run, body: dict[str, Any]) -> Receipt | None:
    """The receipt ``body`` holds when every output file it names is there with its size."""
    directory = artifacts.spool_dir(task_id)
    entries = body["spool"]
    spool = tuple(directory / str(entry["path"]) for entry in entries)
    if len(spool) != len(STREAMS):
        return None
    for path, entry in zip(spool, entries):
        size = entry["size"]
        there = path.parent == directory and path.exists()
        if (size is None and there) or (size is not None and not (there and path.stat().st_size == size)):
            return None
    return Receipt(run.number, str(body["name"]), int(body["code"]), str(body["stdout"]), str(body["stderr"]),
                   bool(body["timedOut"]), (spool[0], spool[1]))


def finished_in(task_id: str, index: int, run: Run) -> bool:
    """Whether ``run`` left a receipt for step ``index`` (the reaper's question: was the step in
    hand cut off, or had its process already ended?)."""
    body = _read(task_id, index)
    return body is not None and body.get("run") == run.pk


def _read(task_id: str, index: int) -> dict[str, Any] | None:
    try:
        body = json.loads(path_of(task_id, index).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("task") != task_id or body.get("step") != index + 1:
        return None
    return body

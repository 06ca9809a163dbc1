"""A process's receipt: how a ``run`` step's (or the command worker's, or an agent's command's)
process ended, kept where a retry finds it whatever instant the worker died in.

The receipt is one file in the task's spool directory, which is the box's (mode 0700, root's):
the task's user can neither write nor forge one. The worker writes its first line (``begin``,
by rename: a whole line or none) before the process starts: the task, the step, the run, the
spool files that will hold the process's whole output. Its second line is the ending: the exit
code and how many bytes each spool file holds. With the sandbox, the process's own init writes
the spool and the ending (``tasks.sandbox.init``): it reaps the command, so the ending is there
before anything learns that the process exited, and a worker killed at any instant after that
cannot lose it. Without the sandbox the worker writes them (``end``) as soon as its wait returns;
a kill between the exit and that write still runs the step again.

A retry that finds a complete receipt for the step it resumes at, begun by an earlier run of the
same task that was lost, records the step's result from it instead of running the step again.
Complete means: both lines parse, the first names this task, this step (and call) and an earlier
run of this task that was lost, and every spool file is there with the size the ending names. A
receipt and its spool files go once the step's result is recorded (``discard``), so one that is
left names a result the log does not have. Anything else is no receipt: the step runs again, as
a step cut off mid-way does, and the log says it was interrupted.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from tasks.models import Run, RunState
from tasks.run import artifacts
from tasks.sandbox.launcher import Keep

if TYPE_CHECKING:
    from tasks.run.context import RunContext
    from tasks.workers.process import Finished

TAIL_BYTES = 64 * 1024  # the output's tail a receipt gives back, as the worker keeps in memory


@dataclass
class Receipt:
    run_number: int
    name: str  # the spool's name (``step-N-run-M``), so its artifacts keep their names
    code: int
    stdout: str
    stderr: str
    timed_out: bool
    spool: tuple[Path, Path]


def path_of(task_id: str, index: int) -> Path:
    return artifacts.spool_dir(task_id) / f"step-{index + 1}.receipt"


def begin(ctx: RunContext, index: int, name: str, spool: tuple[Path, Path], limit: int, *, call: str = "") -> Keep:
    """Begin the receipt of step ``index``'s process (``call``: which of an agent's commands).
    Call before the process starts; pass what it returns to ``process.start``.

    The file is new (written aside, then renamed): an earlier attempt's init, if one still
    holds the receipt it was given, can only write to a file nobody reads any more.

    The first line is not flushed to the disk here: a receipt counts only with its ending, and
    the ending's ``fsync`` (init's, or ``end``'s) flushes the whole file, this line with it. A
    worker's death loses nothing that is only in the page cache; a machine's loses the process
    too, so a first line lost with it leaves what a process cut off mid-way leaves: no
    receipt, and the step runs again."""
    target = path_of(ctx.task.pk, index)
    header = {"task": ctx.task.pk, "step": index + 1, "call": call, "run": ctx.run.pk, "runNumber": ctx.run.number,
              "name": name, "spool": [path.name for path in spool]}
    partial = target.with_suffix(".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(header) + "\n")
    os.replace(partial, target)
    return Keep(target, spool, limit, hold=_hold_once(ctx.task.pk, "init"))


def end(keep: Keep, done: Finished) -> None:
    """The ending as the worker saw it, when init did not write one (no sandbox, or the worker
    stopped the process at its timeout). Call as soon as ``process.wait`` returns."""
    lines = _lines(keep.ending)
    if lines is None or len(lines) != 1:
        return
    sizes = [path.stat().st_size if path.exists() else 0 for path in keep.spool]
    with open(keep.ending, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"code": done.code, "timedOut": done.timed_out, "bytes": sizes}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def discard(task_id: str, index: int) -> None:
    """Remove step ``index``'s receipt and its spool files: the log has the result now."""
    target = path_of(task_id, index)
    lines = _lines(target)
    if lines:
        for name in _spool_names(lines[0]):
            (target.parent / name).unlink(missing_ok=True)
    target.unlink(missing_ok=True)


def find(ctx: RunContext, index: int, *, call: str = "") -> Receipt | None:
    """The complete receipt of step ``index`` (and ``call``) left by a lost earlier run of this
    task, or None (an incomplete or foreign one is removed: the step runs again)."""
    lines = _lines(path_of(ctx.task.pk, index))
    if lines is None:
        return None
    receipt = None
    try:
        header = lines[0]
        run_id = header.get("run")
        run = Run.objects.filter(pk=run_id, task_id=ctx.task.pk).first() if isinstance(run_id, int) else None
        if (len(lines) == 2 and _names(header, ctx.task.pk, index) and header.get("call", "") == call and run is not None
                and run.state == RunState.LOST and run.number < ctx.run.number and header.get("runNumber") == run.number):
            receipt = _complete(ctx.task.pk, run, header, lines[1])
    except (AttributeError, KeyError, TypeError, ValueError):
        receipt = None  # not the shape ``begin`` and the ending leave: not a receipt
    if receipt is None:
        discard(ctx.task.pk, index)
    return receipt


def _complete(task_id: str, run: Run, header: dict[str, Any], ending: dict[str, Any]) -> Receipt | None:
    """The receipt when every spool file is there with the size its ending names."""
    directory = artifacts.spool_dir(task_id)
    spool = tuple(directory / name for name in _spool_names(header))
    sizes = ending["bytes"]
    if len(spool) != 2 or len(sizes) != 2:
        return None
    tails = []
    for path, size in zip(spool, sizes):
        if path.parent != directory or not path.exists() or path.stat().st_size != int(size):
            return None
        with path.open("rb") as handle:
            handle.seek(max(0, int(size) - TAIL_BYTES))
            tails.append(handle.read().decode("utf-8", errors="replace"))
    return Receipt(run.number, str(header["name"]), int(ending["code"]), tails[0], tails[1],
                   bool(ending.get("timedOut", False)), (spool[0], spool[1]))


def finished_in(task_id: str, index: int, run: Run) -> bool:
    """Whether ``run``'s process of step ``index`` ended and its receipt says how (the reaper's
    question: was the step in hand cut off, or had its process already ended?)."""
    lines = _lines(path_of(task_id, index))
    return (lines is not None and len(lines) == 2 and _names(lines[0], task_id, index)
            and lines[0].get("run") == run.pk)


def hold(task_id: str, point: str) -> None:
    """Tests only (``BOX_TEST_HOLD``): wait at ``point``, once per task, for the test to kill
    this worker; a marker in the task's spool directory says it is there."""
    if _hold_once(task_id, point):
        time.sleep(120)


def _hold_once(task_id: str, point: str) -> bool:
    if point not in settings.BOX_TEST_HOLD:
        return False
    marker = held_marker(task_id, point)
    if marker.exists():
        return False
    marker.touch()
    return True


def held_marker(task_id: str, point: str) -> Path:
    return artifacts.spool_dir(task_id) / f"held-{point}"


def _names(header: dict[str, Any], task_id: str, index: int) -> bool:
    return header.get("task") == task_id and header.get("step") == index + 1


def _spool_names(header: dict[str, Any]) -> list[str]:
    names = header.get("spool")
    return [Path(str(name)).name for name in names] if isinstance(names, list) else []


def _lines(path: Path) -> list[dict[str, Any]] | None:
    """The receipt's whole lines, parsed (a line without its newline is not there yet), or None
    when there is no receipt or it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    lines = []
    for line in text.split("\n")[:-1]:
        try:
            body = json.loads(line)
        except ValueError:
            return None
        if not isinstance(body, dict):
            return None
        lines.append(body)
    return lines or None

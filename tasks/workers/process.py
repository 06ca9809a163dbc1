"""Starting and watching a task's processes.

Every process a worker starts goes through ``start``, so the sandbox can wrap it (its own user,
PID and network namespaces) in one place. ``wait`` stops the whole process group when the run
loses its lease, the task's time runs out, or a step's timeout passes.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tasks.broker.paths import process_env
from tasks.run import artifacts, receipts
from tasks.run.evidence import Evidence, tail
from tasks.run.recorder import LeaseLost
from tasks.sandbox import launcher

if TYPE_CHECKING:
    from tasks.run.context import RunContext

MAX_CAPTURE = 64 * 1024  # kept in memory: the tail the log shows
MAX_SPOOL = 8 * 1024 * 1024  # written to the spool: the whole output, for an artifact
WATCH_S = 0.05  # how often a process's wait looks at the run's stop and the time left


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    stopped: bool = False

    def last_error_line(self) -> str:
        for text in (self.stderr, self.stdout):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return ""


def base_env(ctx: RunContext) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(ctx.workdir),
        "LANG": "C.UTF-8",
        "BOX_TASK_ID": ctx.task.pk,
        "BOX_RUN": str(ctx.run.number),
    }

    broker = process_env(ctx.task.pk)  # the run's broker socket, and the `box` client on PATH
    env["BOX_BROKER_SOCKET"] = broker["BOX_BROKER_SOCKET"]
    env["PATH"] = f"{broker['BOX_CLIENT_DIR']}:{env['PATH']}"
    return env


def start(ctx: RunContext, argv: list[str], *, env: dict[str, str], cwd: Path | None = None,
          script: str | None = None, keep: launcher.Keep | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` for the task. Raises ``OSError`` when it cannot start (missing executable).

    ``script`` (for ``argv = ["/bin/sh"]``) reaches the process as a file only it can open, never
    in its command line, which every user of the machine can read. ``keep``: its receipt
    (``tasks.run.receipts.begin``); pass it to ``wait`` too.
    """
    return launcher.popen(ctx, argv, env=env, cwd=cwd or ctx.workdir, script=script, keep=keep)


def _pump(stream: IO[bytes], sink: deque[str], on_line: Callable[[str], None] | None, spool: Path | None = None) -> None:
    size = 0
    spooled = 0
    handle = spool.open("wb") if spool is not None else None
    try:
        for raw in iter(stream.readline, b""):
            if handle is not None and spooled <= MAX_SPOOL:  # the whole output, for the step's artifact
                handle.write(raw[: MAX_SPOOL + 1 - spooled])
                spooled += len(raw)
            line = raw.decode("utf-8", errors="replace")
            size += len(line)
            sink.append(line)
            while sink and size > MAX_CAPTURE:
                size -= len(sink.popleft())
            if on_line is not None:
                on_line(line.rstrip("\n"))
    finally:
        if handle is not None:
            handle.close()
        stream.close()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    launcher.kill(proc)


def wait(ctx: RunContext, proc: subprocess.Popen[bytes], *, timeout_s: float | None = None,
         on_stdout: Callable[[str], None] | None = None, keep: launcher.Keep | None = None) -> Finished:
    """Wait for ``proc``; with ``keep``, its whole stdout and stderr also go to the receipt's
    spool files (written here unless the sandbox's init writes them)."""
    spool = keep.spool if keep is not None and not launcher.keeps_receipts() else None
    out: deque[str] = deque()
    err: deque[str] = deque()
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, on_stdout, spool[0] if spool else None), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, err, None, spool[1] if spool else None), daemon=True)]
    for pump in pumps:
        pump.start()
    started = time.monotonic()
    timed_out = stopped = False
    while proc.poll() is None:
        left = ctx.time_left()
        if ctx.stop.is_set():
            stopped = True
        elif (timeout_s is not None and time.monotonic() - started > timeout_s) or (left is not None and left <= 0):
            timed_out = True
        if stopped or timed_out:
            kill_group(proc)
            break
        try:  # back the moment it exits; a lost lease or a timeout is seen within the interval
            proc.wait(timeout=WATCH_S)
        except subprocess.TimeoutExpired:
            pass
    code = proc.wait()
    for pump in pumps:
        pump.join(timeout=5)
    if not stopped:
        launcher.check_limits(ctx)  # the kernel stopped it at the task's memory limit: say that, not "exit 137"
    return Finished(code, "".join(out), "".join(err), timed_out=timed_out, stopped=stopped)


def wait_spooled(ctx: RunContext, proc: subprocess.Popen[bytes], keep: launcher.Keep, *, timeout_s: float | None = None,
                 on_stdout: Callable[[str], None] | None = None) -> Finished:
    """``wait`` for a process begun with a receipt (``keep``), its whole output in the receipt's
    spool files, and the receipt's ending written (by the sandbox's init, or here). A process
    stopped because the run's lease went raises ``LeaseLost``: its receipt is the next run's to
    judge (an ending init wrote means the process had exited by itself, and is not run again)."""
    done = wait(ctx, proc, timeout_s=timeout_s, on_stdout=on_stdout, keep=keep)
    if done.stopped:
        raise LeaseLost("the run was stopped")
    receipts.end(keep, done)
    receipts.hold(ctx.task.pk, "exited")
    return done


def spool_for(ctx: RunContext, name: str) -> tuple[Path, Path]:
    """Two spool files (stdout, stderr) for a process whose whole output becomes artifacts."""
    directory = artifacts.spool_dir(ctx.task.pk)
    return directory / f"{name}.stdout", directory / f"{name}.stderr"


def output_evidence(ctx: RunContext, name: str, done: Finished, spool: tuple[Path, Path]) -> Evidence:
    """A finished process as evidence: exit code and output tails in the event, the whole
    output (redacted) as the artifacts ``<name>-stdout.txt`` and ``<name>-stderr.txt``. The spool
    files stay: they are the receipt's until the result is recorded (``receipts.discard``)."""
    saved: list[dict[str, Any]] = []
    for stream, path in zip(("stdout", "stderr"), spool):
        if path.exists() and path.stat().st_size:
            saved.append(artifacts.save_text(ctx.task.pk, f"{name}-{stream}.txt", artifacts.read_spool(path),
                                             ctx.recorder.redactor))
    data = {"exitCode": done.code, "stdout": tail(done.stdout), "stderr": tail(done.stderr),
            "timedOut": done.timed_out}
    return Evidence(data, saved)

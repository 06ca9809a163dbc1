"""The command worker: an external agent process (a preset or a configured command line).

Exit 0 is done. Any other exit fails the task with ``worker exited with <code>: <last line it
wrote to stderr>``. A process that cannot start fails the task with the reason. A retry after a
lost run whose process had ended records that ending from its receipt (``tasks.run.receipts``)
instead of starting the process again.
"""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from django.utils import timezone

from tasks.models import EventKind, Task
from tasks.pauses import ApprovalKind
from tasks.run import receipts
from tasks.run.context import RunContext
from tasks.sandbox import paths
from tasks.states import WaitingFor
from tasks.tools.http import host_covered
from tasks.vault.store import read_secret
from tasks.workers import process
from tasks.workers.base import ApprovalRequest, Done, Failed, Outcome, Paused, needs_key
from tasks.workers.flow import record_result
from tasks.workers.presets import Preset, all_presets

MAX_OUTPUT_EVENTS = 500


def _hosts_to_allow(ctx: RunContext, preset: Preset) -> Paused | None:
    """The preset's API hosts the task's hosts do not cover: asked for once (an approval naming
    them); once the owner allowed them they join the task's hosts, in its view and for every later
    run. None when nothing is left to ask."""
    task = ctx.task
    missing = sorted(h for h in preset.hosts if not host_covered(h, task.hosts))
    if not missing:
        return None
    if ctx.resume.get("hosts_allowed") == missing:
        hosts = [*task.hosts, *missing]
        ctx.recorder.guarded(lambda: Task.objects.filter(pk=task.pk).update(hosts=hosts))
        task.hosts = hosts
        ctx.recorder.note(f"the owner allowed {', '.join(missing)} for the {preset.name} worker", {"hosts": missing})
        return None
    reason = f"the {preset.name} worker needs to reach {', '.join(missing)}"
    return Paused(WaitingFor.APPROVAL, reason, resume={"hosts_allowed": missing},
                  approval=ApprovalRequest(ApprovalKind.ACTION, reason, {"preset": preset.name, "hosts": missing},
                                           {"hosts": missing}))


class CommandWorker:
    def run(self, ctx: RunContext) -> Outcome:
        task = ctx.task
        env = process.base_env(ctx)
        env["BOX_PROMPT"] = task.prompt
        if task.worker == "command":
            argv = list(task.command or [])
        else:
            preset = all_presets()[task.worker]

            for key in preset.keys:
                value = read_secret(key)
                if value is None:
                    return needs_key(key, f"the {preset.name} worker")
                env[key] = value
            if preset.keys:  # a key the process prints must not reach the log in clear
                ctx.refresh_redactor()
            asked = _hosts_to_allow(ctx, preset)
            if asked is not None:
                return asked
            # Its dotfiles (sessions, caches, config) go to a HOME of the task's own, outside its
            # copy of the workspace, so they never land in the diff.
            env["HOME"] = str(paths.ensure_private_home(task.pk))
            argv = [part.replace("{prompt}", task.prompt) for part in preset.argv]
        began, clock = timezone.now(), time.monotonic()
        name = f"worker-run-{ctx.run.number}"
        # A lost run whose process had ended left its receipt: the command is not run again.
        receipt = receipts.find(ctx, 0) if ctx.run.number > 1 else None
        if receipt is not None:
            done = process.Finished(receipt.code, receipt.stdout, receipt.stderr, timed_out=receipt.timed_out)
            return self._ended(ctx, argv, receipt.name, done, receipt.spool, began, clock, lines=0, receipt_run=receipt.run_number)
        ctx.recorder.step(f"step 1/1 starting {argv[0]}", {"step": 1, "of": 1, "kind": "command", "argv0": argv[0]})
        spool = process.spool_for(ctx, name)
        keep = receipts.begin(ctx, 0, name, spool, process.MAX_SPOOL)
        try:
            proc = process.start(ctx, argv, env=env, keep=keep)
        except OSError as exc:
            receipts.discard(ctx.task.pk, 0)
            # Name what was missing: the program, or (rarely) a path the sandbox needed for it.
            missing = exc.filename if isinstance(exc.filename, str) else argv[0]
            hint = (f"make {missing} executable (chmod +x) or run it through its interpreter"
                    if isinstance(exc, PermissionError) else "check that the command is installed and the path is right")
            return Failed(f"the worker could not start: {missing}: {exc.strerror or exc}", recoverable=False, hint=hint)
        lines = 0

        def on_stdout(line: str) -> None:
            nonlocal lines
            if line.strip() and lines < MAX_OUTPUT_EVENTS:
                lines += 1
                ctx.recorder.event(EventKind.OUTPUT, line[:2000])

        done = process.wait_spooled(ctx, proc, keep, on_stdout=on_stdout)
        return self._ended(ctx, argv, name, done, spool, began, clock, lines=lines)

    @staticmethod
    def _ended(ctx: RunContext, argv: list[str], name: str, done: process.Finished, spool: tuple[Path, Path],
               began: datetime, clock: float, *, lines: int, receipt_run: int | None = None) -> Outcome:
        """The process ended (in this run, or in a lost one whose receipt says how): its result
        in the log, and the task's outcome."""
        evidence = process.output_evidence(ctx, name, done, spool)
        evidence.data = {"command": argv[0], "linesReported": lines, **evidence.data}
        if receipt_run is not None:
            evidence.data.update(fromReceipt=True, receiptRun=receipt_run)
        error = "ran out of time" if done.timed_out else (None if done.code == 0 else f"exit {done.code}")
        record_result(ctx, 0, 1, "command", began, clock, evidence, error=error)
        if done.timed_out:
            return Failed("the worker ran out of time (limits.max_elapsed_ms)", recoverable=True,
                          hint="raise limits.max_elapsed_ms and retry the task")
        if done.code == 0:
            return Done("worker exited with 0")
        last = done.stderr.strip().splitlines()[-1].strip() if done.stderr.strip() else ""
        return Failed(f"worker exited with {done.code}: {last}".rstrip(": ").rstrip(), recoverable=True)

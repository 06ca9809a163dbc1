"""The flow's ``run`` step: a shell command in the task's sandbox, its values passed as data
(``tasks.workers.values.shell_command``), its result kept as a receipt until the log has it
(``tasks.run.receipts``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.run import receipts
from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed
from tasks.workers import process
from tasks.workers.base import check_time
from tasks.workers.values import shell_command, substitute


def run_step(ctx: RunContext, value: Any, step: dict[str, Any], known: dict[str, Any], index: int, *,
             call: str = "") -> tuple[Any, Evidence]:
    """Run step ``index``'s command (``call``: which of an agent's commands it is); its output and
    evidence, ``StepFailed`` when it failed."""
    timeout = step.get("timeout_s")
    # Values go in as environment variables, not as text of the command (flow authors:
    # docs/reference/api.md, "Values in a run command").
    written = value if isinstance(value, str) else value["cmd"]  # as the flow has it: ${name}, no values
    cmd, values = shell_command(written, known)
    env = process.base_env(ctx)
    if isinstance(value, dict):
        env.update({str(k): str(v) for k, v in substitute(value.get("env", {}), known).items()})
    env.update(values)
    name = f"step-{index + 1}-run-{ctx.run.number}"
    spool = process.spool_for(ctx, name)
    # The receipt is begun before the process starts; its ending is written the moment the
    # process is reaped (by the sandbox's init): a kill from then on runs nothing again.
    keep = receipts.begin(ctx, index, name, spool, process.MAX_SPOOL, call=call)
    try:
        proc = process.start(ctx, ["/bin/sh"], env=env, script=cmd, keep=keep)  # not argv: /proc shows it to all
    except OSError as exc:
        raise StepFailed(f"cannot start the shell: {exc}", evidence=Evidence({"command": written})) from exc
    done = process.wait_spooled(ctx, proc, keep, timeout_s=timeout)
    return run_result(ctx, written, name, done, spool, timeout)


def run_result(ctx: RunContext, written: str, name: str, done: process.Finished, spool: tuple[Path, Path],
               timeout: Any) -> tuple[Any, Evidence]:
    """A ``run`` step's ended process as its result and evidence; ``StepFailed`` when it failed."""
    evidence = process.output_evidence(ctx, name, done, spool)
    evidence.data = {"command": written, **evidence.data}
    if done.timed_out:
        check_time(ctx)  # the task's running time is up: that is a limit, not a step failure
        raise StepFailed(f"timed out after {timeout}s", evidence=evidence)
    if done.code != 0:
        raise StepFailed(f"exit {done.code}: {done.last_error_line()}", page_text=done.stdout + done.stderr,
                         evidence=evidence)
    return done.stdout.strip(), evidence


def from_step_receipt(ctx: RunContext, step: dict[str, Any], receipt: receipts.Receipt) -> tuple[Any, Evidence]:
    """A ``run`` step's result from the receipt a lost earlier run left when the step's process
    had ended (``tasks.run.receipts``): recorded, not run again."""
    done = process.Finished(receipt.code, receipt.stdout, receipt.stderr, timed_out=receipt.timed_out)
    value = step["run"]
    written = value if isinstance(value, str) else value["cmd"]
    try:
        result, evidence = run_result(ctx, written, receipt.name, done, receipt.spool, step.get("timeout_s"))
    except StepFailed as exc:
        exc.evidence.data.update(fromReceipt=True, receiptRun=receipt.run_number)
        raise
    evidence.data.update(fromReceipt=True, receiptRun=receipt.run_number)
    return result, evidence

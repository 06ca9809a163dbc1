"""The command worker: an external agent process (a preset or a configured command line).

Exit 0 is done. Any other exit fails the task with ``worker exited with <code>: <last line it
wrote to stderr>``. A process that cannot start fails the task with the reason.
"""
from __future__ import annotations

from tasks.context import RunContext
from tasks.models import EventKind
from tasks.recorder import LeaseLost
from tasks.workers import process
from tasks.workers.base import Done, Failed, Outcome
from tasks.workers.presets import all_presets

MAX_OUTPUT_EVENTS = 500


class CommandWorker:
    def run(self, ctx: RunContext) -> Outcome:
        task = ctx.task
        env = process.base_env(ctx)
        env["BOX_PROMPT"] = task.prompt
        if task.worker == "command":
            argv = list(task.command or [])
        else:
            preset = all_presets()[task.worker]
            from tasks.vault import read_secret

            for key in preset.keys:
                value = read_secret(key)
                if value is None:
                    return Failed(f"the vault has no {key}, which the {preset.name} worker needs", recoverable=True,
                                  hint=f"set {key} in Settings → Vault, then run the task again")
                env[key] = value
            if preset.keys:  # a key the process prints must not reach the log in clear
                from tasks.facts import Redactor

                ctx.recorder.redactor = Redactor({**ctx.facts.secrets(), **{k: env[k] for k in preset.keys}})
            argv = [part.replace("{prompt}", task.prompt) for part in preset.argv]
        ctx.recorder.step(f"starting {argv[0]}", {"argv0": argv[0]})
        try:
            proc = process.start(ctx, argv, env=env)
        except OSError as exc:
            # Name what was missing: the program, or (rarely) a path the sandbox needed for it.
            missing = exc.filename if isinstance(exc.filename, str) else argv[0]
            return Failed(f"the worker could not start: {missing}: {exc.strerror or exc}", recoverable=False,
                          hint="check that the command is installed and the path is right")
        lines = 0

        def on_stdout(line: str) -> None:
            nonlocal lines
            if line.strip() and lines < MAX_OUTPUT_EVENTS:
                lines += 1
                ctx.recorder.event(EventKind.OUTPUT, line[:2000])

        done = process.wait(ctx, proc, on_stdout=on_stdout)
        if done.stopped:
            raise LeaseLost("the run was stopped")
        if done.timed_out:
            return Failed("the worker ran out of time (limits.max_elapsed_ms)", recoverable=True,
                          hint="raise limits.max_elapsed_ms and run the task again")
        if done.code == 0:
            return Done("worker exited with 0")
        last = done.stderr.strip().splitlines()[-1].strip() if done.stderr.strip() else ""
        return Failed(f"worker exited with {done.code}: {last}".rstrip(": ").rstrip(), recoverable=True)

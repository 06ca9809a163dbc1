"""The flow worker: interprets a task's flow (docs/architecture.md#flows), one step at a time.

Each step's event is persisted before the next step begins, and so is the resume point, so a
retried run picks up at the first step not yet finished.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import stat
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from approvals import actions
from approvals.models import ActionKind, ApprovalKind
from tasks import step_receipts as receipts
from tasks.broker.protocol import CallError
from tasks.browser import kinds as browser_kinds
from tasks.context import RunContext
from tasks.evidence import Evidence, StepFailed, bounded
from tasks.facts import guess_kind, open_records, seal_records
from tasks.flows import EXECUTABLE_KINDS, STEP_KINDS, missing_names, step_kind
from tasks.human import looks_like_human_wall
from tasks.model import KeyMissing, ModelError, NoModel
from tasks.models import EventKind, TaskEvent
from tasks.net import Blocked
from tasks.recorder import LeaseLost, LimitReached
from tasks.states import WaitingFor
from tasks.tools import NeedsApproval, call
from tasks.workers import process
from tasks.workers.asking import ask_model
from tasks.workers.base import ApprovalRequest, Continue, Done, Failed, Outcome, Paused, needs_key
from tasks.workers.planner import after_owner, plan, replan
from tasks.workers.rescuer import rescue

if TYPE_CHECKING:
    from tasks.browser.session import BrowserSession

GATES = ("approve", "checkpoint", "ask")

_NAME = re.compile(r"\$\{([^}]+)\}")


def substitute(value: Any, values: dict[str, Any]) -> Any:
    """Replace ``${name}`` with its value; called only at the moment a step executes."""
    if isinstance(value, str):
        return _NAME.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), value)
    if isinstance(value, dict):
        return {k: substitute(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, values) for v in value]
    return value


SHELL_VALUE_PREFIX = "BOX_VALUE_"


def shell_command(cmd: str, values: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """``cmd`` with each ``${name}`` turned into a reference to an environment variable holding
    the value, and those variables: a value reaches the shell as data, never as code.

    The reference fits where the name stands, so the value arrives as one literal word: unquoted
    it becomes ``"$BOX_VALUE_n"``, inside double quotes ``${BOX_VALUE_n}``, inside single quotes
    the quotes are closed around it (``'"$BOX_VALUE_n"'``). Expansion results are never parsed
    again by the shell, so ``$(...)``, backquotes and ``;`` in a value stay text.
    """
    out: list[str] = []
    env: dict[str, str] = {}
    by_name: dict[str, str] = {}
    quote = ""  # "", "'" or '"': the shell's quoting state at this point of the command
    i = 0
    while i < len(cmd):
        char = cmd[i]
        match = _NAME.match(cmd, i) if char == "$" else None
        if match and match.group(1) in values:
            name = match.group(1)
            if name not in by_name:
                by_name[name] = f"{SHELL_VALUE_PREFIX}{len(by_name) + 1}"
                env[by_name[name]] = str(values[name])
            var = by_name[name]
            out.append({"": f'"${{{var}}}"', '"': f"${{{var}}}", "'": f"'\"${{{var}}}\"'"}[quote])
            i = match.end()
            continue
        if char == "\\" and quote != "'" and i + 1 < len(cmd):
            out.append(cmd[i:i + 2])
            i += 2
            continue
        if char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        out.append(char)
        i += 1
    return "".join(out), env


def inside(workdir: Path, relative: str) -> Path:
    """The path under ``workdir``; refuses anything that would land outside it."""
    if not relative or relative.startswith("/"):
        raise StepFailed(f"'{relative}' is not a relative path inside the task's files")
    target = (workdir / relative)
    resolved_parent = target.parent.resolve()
    root = workdir.resolve()
    if resolved_parent != root and root not in resolved_parent.parents:
        raise StepFailed(f"'{relative}' is outside the task's files")
    if target.is_symlink():
        link = target.resolve()
        if link != root and root not in link.parents:
            raise StepFailed(f"'{relative}' is a link to outside the task's files")
    return target


def make_parents(workdir: Path, target: Path) -> list[Path]:
    """Create the missing directories above ``target``; return them, outermost first."""
    missing: list[Path] = []
    parent = target.parent
    while parent != workdir and not parent.exists():
        missing.append(parent)
        parent = parent.parent
    missing.reverse()
    for directory in missing:
        directory.mkdir()
    return missing


def give_to_task_user(workdir: Path, created: list[Path]) -> None:
    """What a step created belongs to whoever owns the root of the task's view: the task's user
    on the overlay driver (its upper layer is the user's), root on disk where the view is shown
    to the sandbox id-mapped (the copy driver). Otherwise a later ``run`` step, which runs as
    the task's user, could not write into a directory a ``write`` step made."""
    if os.geteuid() != 0 or not created:
        return
    owner = os.stat(workdir)
    for path in created:
        os.lchown(path, owner.st_uid, owner.st_gid)


def describe(step: dict[str, Any], index: int, total: int) -> str:
    kind = step_kind(step)
    label = step.get("name")
    value = step[kind]
    if label:
        return f"step {index + 1}/{total} {kind}: {label}"
    if isinstance(value, str):
        return f"step {index + 1}/{total} {kind}: {value[:200]}"
    key = next((k for k in ("cmd", "path", "url", "name", "prompt", "selector") if k in value), None)
    return f"step {index + 1}/{total} {kind}" + (f": {str(value[key])[:200]}" if key else "")


class FlowWorker:
    def __init__(self) -> None:
        self._browser: BrowserSession | None = None
        self._at_payment = False  # the run pauses in front of a payment: its browser is kept

    def run(self, ctx: RunContext) -> Outcome:
        """Run the flow; the run's browser (if a step started one) is released whatever happens,
        except at a pause in front of a payment, which keeps it (``BrowserSession.park``) until
        the next run attaches to it, the task is cancelled or it ends."""
        outcome: Outcome | None = None
        try:
            outcome = self._run(ctx)
            return outcome
        finally:
            if self._browser is not None:
                if self._at_payment and isinstance(outcome, Paused):
                    self._browser.park()
                else:
                    self._browser.close()
                self._browser = None

    def browser(self, ctx: RunContext, index: int, known: dict[str, Any]) -> BrowserSession:
        """The run's browser session, started by the first browser step. A run after a pause in
        front of a payment attaches to the browser that pause kept, on the page as it was. Any
        other run that starts in the middle of the flow (after a pause, a retry) opens a fresh
        browser, so it first re-opens the page: the steps since the last ``browse`` run again,
        without evidence."""
        from tasks.browser.session import BrowserSession  # noqa: PLC0415 - Playwright: only for a flow with a browser step

        if self._browser is None:
            self._browser = BrowserSession(ctx)
        if self._browser.started:
            return self._browser
        if self._browser.attach():
            ctx.recorder.note("browser kept from the pause: same page, nothing replayed", {"browser": True, "kept": True})
            return self._browser
        self._browser.start()
        ctx.recorder.note(f"browser started in {self._browser.started_ms} ms", {"browser": True, "startMs": self._browser.started_ms})
        steps: list[dict[str, Any]] = (ctx.task.flow or {}).get("steps", [])
        opened = [i for i in range(index) if step_kind(steps[i]) == "browse"]
        if step_kind(steps[index]) == "browse" or not opened:
            return self._browser
        from tasks.browser import steps as browser_steps  # noqa: PLC0415 - as above

        replay = [i for i in range(opened[-1], index) if step_kind(steps[i]) in browser_kinds.ACTING]
        ctx.recorder.note(f"re-opening the page: steps {', '.join(str(i + 1) for i in replay)} again",
                          {"browser": True, "replayed": [i + 1 for i in replay]})
        for i in replay:
            kind = step_kind(steps[i])
            try:
                value, _ = ground_target(ctx, self._browser, kind, substitute(steps[i][kind], known), steps[i], i)
                browser_steps.execute(ctx, self._browser, kind, value, steps[i], index=i, approved=False, replay=True)
            except (StepFailed, browser_kinds.PaymentStop, NeedsApproval) as exc:
                raise StepFailed(f"re-opening the page failed at step {i + 1}: {exc}") from exc
        return self._browser

    def _run(self, ctx: RunContext) -> Outcome:
        if ctx.task.flow is None:  # a plain-language task: the planner writes its flow first
            stopped = plan(ctx)
            if stopped is not None:
                return stopped
        if "replan_after" in ctx.resume:  # a replan that waited (for the owner, the budget, a key)
            steps_now = list((ctx.task.flow or {}).get("steps", []))
            at, error = int(ctx.resume.get("step", 0)), str(ctx.resume["replan_after"])
            if ctx.resume.get("ask_owner"):
                return after_owner(ctx, steps_now, at, error)
            return replan(ctx, steps_now, at, error) or Failed(f"step {at + 1} failed: {error}", recoverable=True)
        flow = ctx.task.flow or {}
        steps: list[dict[str, Any]] = list(flow.get("steps", []))
        for at, amended in (ctx.resume.get("amended") or {}).items():  # the rescuer's amended steps
            if 0 <= int(at) < len(steps):
                steps[int(at)] = amended
        # Saved values are data: stored real (sealed when something in them is secret,
        # tasks.facts.seal_records) and redacted only where they are shown.
        records: dict[str, Any] = open_records(ctx.task.records or {}, ctx.facts.values)
        known = {**flow.get("vars", {}), **records, **ctx.facts.values}
        missing = missing_names(flow, {**ctx.facts.values, **records})
        if missing:
            fields = [{"name": n, "why": f"the flow uses ${{{n}}} and no fact supplies it", "kind": guess_kind(n), "options": []} for n in missing]
            return Paused(WaitingFor.INPUT, "the task needs values before it can start", resume=ctx.resume, fields=fields)
        resume = ctx.resume
        start = int(resume.get("step", 0))
        approved = resume.get("approved_step")
        only = bool(resume.get("only"))
        allow_destructive = bool(ctx.task.constraints.get("allow_destructive"))
        total = len(steps)
        for index in range(start, total):
            check_time(ctx)
            step = steps[index]
            kind = step_kind(step)
            is_approved = approved == index
            guard = {"step": index, "kind": kind, "name": step.get("name", "")}
            if kind in GATES:
                gate = self._gate(ctx, step, kind, index, total, is_approved, guard, known)
                if gate is not None:
                    return gate
                began, clock = timezone.now(), time.monotonic()
                ctx.recorder.step(describe(substitute(step, known), index, total), self._start_data(ctx, index, total, kind, start),
                                  progress=(index + 1) / total)
                record_result(ctx, index, total, kind, began, clock, Evidence({"passed": True}), resume={"step": index + 1})
                continue
            if kind not in EXECUTABLE_KINDS:
                return Failed(f"step {index + 1}: '{kind}' steps are not available in this box yet", recoverable=False,
                              hint="remove the step or run the task on a box with browser/model support")
            if "stop_before" in step and not allow_destructive and not is_approved:
                if kind == "http":  # a consequential request: its action is proposed with the approval
                    action = http_action(ctx, index, substitute(step[kind], known))
                    guard = {**guard, "action": action.pk}
                return self._ask_approval(index, ApprovalKind.IRREVERSIBLE, step["stop_before"], guard,
                                          detail=planned_action(ctx, kind, substitute(step[kind], known), step, known))
            began, clock = timezone.now(), time.monotonic()
            # A lost run whose step's process had ended left its receipt: the step is not run again.
            receipt = receipts.find(ctx, index) if kind == "run" and index == start and ctx.run.number > 1 else None
            if receipt is None:
                started = self._start_data(ctx, index, total, kind, start)
                # The summary shows values, not ${names} (a secret value is masked back to its name).
                # An acting step is counted in the write that records its start (a tool call counts
                # itself, tasks.tools.call): past the limit, nothing is recorded.
                acts = STEP_KINDS[kind].acts and kind != "tool"
                ctx.recorder.step(describe(substitute(step, known), index, total) + (" (retry)" if started.get("retry") else ""),
                                  started, progress=index / total, counts=("actions", "max_actions") if acts else None)
            resolved = step[kind] if kind == "run" else substitute(step[kind], self._for_model(ctx, known) if kind == "model" else known)
            try:
                if receipt is not None:
                    result, evidence = from_step_receipt(ctx, step, receipt)
                else:
                    result, evidence = self._execute(ctx, kind, resolved, step, known=known, approved=is_approved, index=index,
                                                     position=step_position(index))
            except actions.ActionUnknown as unknown:
                # Never called again by itself: the owner says what happened, and the run that
                # follows the answer comes back to this step (an OK given for it still holds).
                again: dict[str, Any] = {"step": index}
                if is_approved:
                    again.update(approved_step=index, only=only)
                return Paused(WaitingFor.HUMAN, f"step {index + 1}: {unknown}; did it happen?", resume=again,
                              reconcile=unknown.action.pk)
            except KeyMissing as no_key:
                return needs_key(no_key.key_name, "the configured model", {"step": index})
            except NeedsApproval as need:
                self._at_payment = need.kind == ApprovalKind.PAYMENT
                guard = {**guard, **need.guard, "step": index}
                detail = {**planned_action(ctx, kind, resolved, step, known), **(need.detail or {})}
                return self._ask_approval(index, need.kind, need.summary, guard, detail=detail, amount_cents=need.amount_cents)
            except browser_kinds.PaymentStop as stop:
                self._at_payment = True
                record_result(ctx, index, total, kind, began, clock, stop.evidence, error=stop.message)
                # Paying is never automatic: a person pays, and only cancel ends the task.
                return Paused(WaitingFor.CHECKPOINT, stop.message, resume={"step": index}, continuable=False)
            except StepFailed as exc:
                if ctx.stop.is_set():
                    raise LeaseLost("stopped") from exc
                record_result(ctx, index, total, kind, began, clock, exc.evidence, error=exc.message)
                wall = looks_like_human_wall(f"{exc.message}\n{exc.page_text}")
                if wall:
                    # Continuing re-runs this step; an OK the owner gave for it still holds.
                    retry: dict[str, Any] = {"step": index}
                    if is_approved:
                        retry.update(approved_step=index, only=only)
                    return Paused(WaitingFor.HUMAN, f"step {index + 1} hit {wall}; a person must get past it, then continue",
                                  resume=retry)
                rescued = rescue(ctx, steps, index, exc.message, exc.evidence.data, resume)
                if rescued is not None:
                    return rescued
                if ctx.task.spent.get("plans"):
                    replanned = replan(ctx, steps, index, exc.message)
                    if replanned is not None:
                        return replanned
                return Failed(f"step {index + 1} ({kind}) failed: {exc.message}", recoverable=True,
                              hint="fix the cause and retry the task")
            if "save" in step:
                records[step["save"]] = result
                known[step["save"]] = result
            # The result and the resume point past the step in one write: a step whose result is
            # in the log never runs again.
            record_result(ctx, index, total, kind, began, clock, evidence, resume={"step": index + 1},
                          records=seal_records(records, ctx.recorder.redactor))
            if only and is_approved and index + 1 < total and kind not in browser_kinds.KINDS:
                # A browser step goes on in this run: a new run's fresh browser would have to
                # re-open the page by replaying steps, and the approved step must never run twice.
                return Continue(resume={"step": index + 1})
        return Done(f"finished all {total} steps")

    @staticmethod
    def _for_model(ctx: RunContext, known: dict[str, Any]) -> dict[str, Any]:
        """The values a model may see by value: a secret stays ``${name}``."""
        return {k: v for k, v in known.items() if k not in ctx.facts.secret_names}

    def _start_data(self, ctx: RunContext, index: int, total: int, kind: str, start: int) -> dict[str, Any]:
        """The start event's fields; ``retry`` when an earlier run already began this step
        (it was cut off, and this run executes it again)."""
        data: dict[str, Any] = {"step": index + 1, "of": total, "kind": kind}
        if index == start and ctx.run.number > 1 and TaskEvent.objects.filter(
                task_id=ctx.task.pk, kind=EventKind.STEP, data__step=index + 1, data__kind=kind).exists():
            data["retry"] = True
            data["run"] = ctx.run.number
        return data

    def _gate(self, ctx: RunContext, step: dict[str, Any], kind: str, index: int, total: int, approved: bool,
              guard: dict[str, Any], known: dict[str, Any]) -> Outcome | None:
        """An explicit gate (approve, checkpoint, ask): a pause, or None to go on past it."""
        value = step[kind]
        if kind == "approve":
            if approved:
                return None
            reason = value if isinstance(value, str) else value.get("reason", "approve to go on")
            steps = (ctx.task.flow or {}).get("steps", [])
            after = steps[index + 1] if index + 1 < len(steps) else None
            detail: dict[str, Any] = {}
            if after is not None and step_kind(after) in EXECUTABLE_KINDS and step_kind(after) not in GATES:
                detail = {"then": index + 2, **planned_action(ctx, step_kind(after), substitute(after[step_kind(after)], known), after, known)}
            return self._ask_approval(index, ApprovalKind.CHECKPOINT, reason, guard, detail=detail)
        if kind == "checkpoint":
            return self._checkpoint(ctx, value, index, approved, guard)
        spec = value if isinstance(value, dict) else {"name": value}
        name = spec["name"]
        if known.get(name) not in ("", None):
            return None
        field = {"name": name, "why": spec.get("why", f"step {index + 1} asks for it"),
                 "kind": spec.get("kind", guess_kind(name)), "options": spec.get("options", [])}
        return Paused(WaitingFor.INPUT, spec.get("why") or f"step {index + 1} asks for {name}", resume={"step": index}, fields=[field])

    def _ask_approval(self, index: int, kind: ApprovalKind, reason: str, guard: dict[str, Any], *,
                      detail: dict[str, Any] | None = None, amount_cents: int = 0) -> Paused:
        """Pause before step ``index``; approving runs exactly that step once, then the rest anew."""
        return Paused(
            WaitingFor.APPROVAL, reason, resume={"step": index, "approved_step": index, "only": True},
            approval=ApprovalRequest(kind, reason, {"step": index + 1, **(detail or {})}, guard, amount_cents),
        )

    def _checkpoint(self, ctx: RunContext, value: Any, index: int, approved: bool, guard: dict[str, Any]) -> Outcome | None:
        spec = value if isinstance(value, dict) else {"reason": value}
        reason = spec.get("reason", "checkpoint")
        if spec.get("payment"):
            self._at_payment = not approved
            if ctx.task.constraints.get("payment", "stop_at_payment") == "stop_at_payment":
                # Paying is never automatic: a person pays, and only cancel releases the task.
                return Paused(WaitingFor.CHECKPOINT, f"{reason}: paying is for a person; this task stops here",
                              resume={"step": index}, continuable=False)
            if approved:
                return None  # fill_then_approve: the owner's OK presses the control that pays
            return self._ask_approval(index, ApprovalKind.PAYMENT, reason, guard)
        if approved:
            return None
        continuable = bool(spec.get("continuable", True))
        return Paused(WaitingFor.CHECKPOINT, reason, resume={"step": index, "approved_step": index}, continuable=continuable,
                      approval=ApprovalRequest(ApprovalKind.CHECKPOINT, reason, {"step": index + 1}, guard)
                      if continuable else None)

    def _execute(self, ctx: RunContext, kind: str, value: Any, step: dict[str, Any], *,
                 known: dict[str, Any], approved: bool, index: int, position: str = "call", call: str = "") -> tuple[Any, Evidence]:
        """Run one step; its result and what it did. ``StepFailed`` carries what it did too.
        ``position`` finds the step's action again (``approvals.actions``); ``ActionUnknown`` when
        an earlier attempt of it was cut off mid-call. ``call``: which of an agent's commands a
        ``run`` is (its receipt's, ``tasks.step_receipts``)."""
        timeout = step.get("timeout_s")
        if kind == "run":
            # Values go in as environment variables, not as text of the command (flow authors:
            # docs/api.md, "Values in a run command").
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
            done = process.wait(ctx, proc, timeout_s=timeout, keep=keep)
            if done.stopped:
                # The run is over: its receipt is the next run's to judge (an ending init wrote
                # means the process had exited by itself, and the step is not run again).
                raise LeaseLost("stopped")
            receipts.end(keep, done)
            receipts.hold(ctx.task.pk, "exited")
            return run_result(ctx, written, name, done, spool, timeout)
        if kind == "write":
            target = inside(ctx.workdir, value["path"])
            content = value["content"] if isinstance(value["content"], str) else json.dumps(value["content"])
            created = make_parents(ctx.workdir, target)
            if target.is_symlink():
                target.unlink()
            new_file = not os.path.lexists(target)
            if new_file:
                created.append(target)
            write_regular(target, content)
            give_to_task_user(ctx.workdir, created)
            return value["path"], Evidence({"path": value["path"], "bytes": target.stat().st_size, "created": new_file})
        if kind == "delete":
            relative = value if isinstance(value, str) else value["path"]
            target = inside(ctx.workdir, relative)
            if target.is_dir() and not target.is_symlink():
                size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file() and not f.is_symlink())
                shutil.rmtree(target)
                return relative, Evidence({"path": relative, "bytes": size, "directory": True})
            if target.exists() or target.is_symlink():
                size = target.lstat().st_size
                target.unlink()
                return relative, Evidence({"path": relative, "bytes": size, "directory": False})
            raise StepFailed(f"'{relative}' does not exist", evidence=Evidence({"path": relative}))
        if kind == "http":
            spec: dict[str, Any] = {"url": value} if isinstance(value, str) else value
            method = str(spec.get("method", "GET")).upper()
            asked = {"method": method, "url": spec["url"]}
            if "stop_before" in step:
                return consequential_http(ctx, index, spec, asked)
            try:
                response = ctx.http(method, spec["url"], headers=spec.get("headers", {}), body=spec.get("body"))
            except Blocked as exc:
                raise StepFailed(str(exc), evidence=Evidence({**asked, "blocked": str(exc)})) from exc
            except OSError as exc:
                raise StepFailed(f"request failed: {exc}", evidence=Evidence({**asked, "error": str(exc)})) from exc
            return http_answer(response, asked)
        if kind in browser_kinds.KINDS:
            from tasks.browser import steps as browser_steps  # noqa: PLC0415 - Playwright: only for a browser step

            session = self.browser(ctx, index, known)
            value, grounding = ground_target(ctx, session, kind, value, step, index)
            try:
                result, evidence = browser_steps.execute(ctx, session, kind, value, step, index=index, approved=approved)
            except StepFailed as exc:
                if grounding:
                    exc.evidence.data["grounding"] = grounding
                raise
            if grounding:
                evidence.data["grounding"] = grounding
            return result, evidence
        if kind == "tool":
            args = substitute(step.get("args", {}), known)
            replays: list[dict[str, Any]] = []
            try:
                result = call_tool(ctx, value, args, approved=approved, position=position, replays=replays)
            except StepFailed as exc:
                exc.evidence = Evidence({"tool": value, "args": bounded(args), "error": exc.message})
                raise
            # Answered from an earlier call's receipt: the result is what the receipt kept, and the log says so.
            replayed = {"replayed": True, **replays[0]} if replays else {}
            return result, Evidence({"tool": value, "args": bounded(args), "result": bounded(result), **replayed})
        if kind == "model":
            return model_step(ctx, value)
        raise StepFailed(f"'{kind}' is not executable")


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
    had ended (``tasks.step_receipts``): recorded, not run again."""
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


def ground_target(ctx: RunContext, session: BrowserSession, kind: str, value: Any, step: dict[str, Any],
                  index: int) -> tuple[Any, dict[str, Any] | None]:
    """A target described in plain words becomes a selector (``tasks.browser.grounding``)."""
    if not (isinstance(value, dict) and "describe" in value):
        return value, None
    if kind not in ("click", "fill"):
        raise StepFailed(f"'describe' finds the element of a click or fill step, not of a '{kind}' step")
    timeout_s = float(step.get("timeout_s") or browser_kinds.DEFAULT_TIMEOUT_S)
    from tasks.browser import grounding  # noqa: PLC0415 - Playwright: only for a browser step

    found, how = grounding.ground(ctx, session, kind, value, index=index, timeout_s=timeout_s,
                                  trace=bool((ctx.task.flow or {}).get("trace")))
    return found, how


def model_step(ctx: RunContext, value: Any) -> tuple[Any, Evidence]:
    """A ``model`` step: one call (its prompt already carries values, secrets as ``${name}``);
    the answer is text, or JSON checked against the step's ``schema``."""
    spec: dict[str, Any] = {"prompt": value} if isinstance(value, str) else value
    messages = ([{"role": "system", "content": spec["system"]}] if spec.get("system") else []) + [
        {"role": "user", "content": spec["prompt"]}]
    asked = {"prompt": bounded(ctx.recorder.redactor.text(spec["prompt"]))}
    try:
        decision, answer = ask_model(ctx, messages, purpose="model step", schema=spec.get("schema"))
    except NoModel as exc:
        raise StepFailed(f"{exc}", evidence=Evidence(asked)) from exc
    except ModelError as exc:
        raise StepFailed(str(exc), evidence=Evidence(asked)) from exc
    return answer, Evidence({**asked, "decision": decision.shown(),
                             "answer": bounded(answer), "usage": decision.usage.shown(),
                             "costCents": round(decision.cost_cents, 4)})


def planned_action(ctx: RunContext, kind: str, value: Any, step: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    """What a step would do, for the approval that asks before it: the exact command, the file
    and the content (with a diff against what is there now), the request, the tool and its
    arguments. Bounded; redacted where the approval is stored."""
    if kind == "run":
        return {"action": "run", "command": value if isinstance(value, str) else value["cmd"]}
    if kind == "write":
        content = value["content"] if isinstance(value["content"], str) else json.dumps(value["content"])
        planned: dict[str, Any] = {"action": "write", "path": value["path"], "bytes": len(content.encode()),
                                   "content": bounded(content, chars=4000)}
        try:
            target = inside(ctx.workdir, value["path"])
            before = target.read_text() if target.is_file() else None
        except (StepFailed, OSError, UnicodeDecodeError):
            before = None
        if before is not None:
            diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), content.splitlines(keepends=True),
                                                f"a/{value['path']}", f"b/{value['path']}"))
            planned["diff"] = bounded(diff or "(no change)", chars=4000)
        return planned
    if kind == "delete":
        return {"action": "delete", "path": value if isinstance(value, str) else value["path"]}
    if kind == "http":
        spec: dict[str, Any] = {"url": value} if isinstance(value, str) else value
        return {"action": "http", "method": str(spec.get("method", "GET")).upper(), "url": spec["url"],
                **({"body": bounded(spec["body"])} if spec.get("body") is not None else {})}
    if kind == "tool":
        return {"action": "tool", "tool": value, "args": bounded(substitute(step.get("args", {}), known))}
    return {"action": kind}


def record_result(ctx: RunContext, index: int, total: int, kind: str, began: datetime, clock: float,
                  evidence: Evidence, *, error: str | None = None, resume: dict[str, Any] | None = None,
                  records: dict[str, Any] | None = None) -> None:
    """Log what step ``index`` did (``step_result``), before the next step begins; with
    ``resume``/``records``, the progress past it is saved in the same transaction."""
    if kind in ("run", "command"):
        receipts.hold(ctx.task.pk, "recording")
    duration_ms = int((time.monotonic() - clock) * 1000)
    data = {"step": index + 1, "of": total, "kind": kind, "ok": error is None, "startedAt": began.isoformat(),
            "durationMs": duration_ms, **evidence.data}
    if error is not None:
        data["error"] = error
    ctx.recorder.event(EventKind.STEP_RESULT, f"step {index + 1}/{total} {kind}: {result_words(kind, data)}", data,
                       artifacts=evidence.artifacts, resume=resume, records=records)
    if kind in ("run", "command"):
        receipts.discard(ctx.task.pk, index)  # the log has the result now


def result_words(kind: str, data: dict[str, Any]) -> str:
    """A few words for a result's summary line."""
    took = f" in {data['durationMs'] / 1000:.1f} s"
    if "error" in data and "exitCode" not in data and "status" not in data:
        return f"failed: {data['error']}"[:300]
    if kind in ("run", "command") and data.get("fromReceipt"):
        return (f"exit {data.get('exitCode')}{' (timed out)' if data.get('timedOut') else ''}; not run again: "
                f"recorded after a restart from the step's receipt (run {data.get('receiptRun')})")
    if kind in ("run", "command"):
        return f"exit {data.get('exitCode')}{' (timed out)' if data.get('timedOut') else ''}{took}"
    if kind == "write":
        return f"wrote {data['path']} ({data['bytes']} bytes){took}"
    if kind == "delete":
        return f"deleted {data['path']} ({data['bytes']} bytes){took}"
    if kind == "http" and data.get("replayed"):
        return f"{data['method']} {data['url'][:200]} → {data['status']}; {from_receipt(data, 'sent')}{took}"
    if kind == "http":
        return f"{data['method']} {data['url'][:200]} → {data['status']}{took}"
    if kind == "tool" and data.get("replayed"):
        return f"{data['tool']} returned; {from_receipt(data, 'called')}{took}"
    if kind == "tool":
        return f"{data['tool']} {'failed' if 'error' in data else 'returned'}{took}"
    if kind == "model":
        return f"answered: {str(data.get('answer', ''))[:120]}{took}"
    return f"passed{took}"


def from_receipt(data: dict[str, Any], verb: str) -> str:
    """A replayed step's words: it was not done again, and what answered it instead."""
    receipt = data.get("receipt") or {}
    if "reconciled" in receipt:
        return f"not {verb} again: the owner said the earlier attempt (action {data.get('action')}) happened"
    return f"not {verb} again: answered from the earlier call's receipt (action {data.get('action')})"


def step_position(index: int) -> str:
    """Where a flow's action stands: its step, so a resumed run finds the same action."""
    return f"step:{index + 1}"


def http_action(ctx: RunContext, index: int, value: Any) -> actions.Action:
    """The action of an ``http`` step with ``stop_before``: its real request is its arguments."""
    spec: dict[str, Any] = {"url": value} if isinstance(value, str) else value
    method = str(spec.get("method", "GET")).upper()
    args = {"method": method, "url": spec["url"], "headers": spec.get("headers", {}), "body": spec.get("body")}
    return actions.propose(ctx.recorder, ctx.run.pk, kind=ActionKind.HTTP, target=f"{method} {spec['url']}",
                           position=step_position(index), args=args, policy=actions.policy_of(ctx.task))


def consequential_http(ctx: RunContext, index: int, spec: dict[str, Any], asked: dict[str, Any]) -> tuple[Any, Evidence]:
    """An approved (or allowed) ``http`` step with ``stop_before``: the request is sent at most
    once. A response is a confirmed outcome (its receipt: status, size, digest, an excerpt); a
    request the policy refused or nobody answered never reached a provider (failed); anything
    else (a reset, a timeout, a worker killed mid-call) leaves the outcome unknown."""
    action = http_action(ctx, index, spec)
    try:
        receipt = actions.replayed_receipt(action)
    except actions.ActionFailedBefore as before:
        raise StepFailed(f"the request failed before and is not sent again: {before.action.error}",
                         evidence=Evidence({**asked, "action": action.pk})) from before
    if receipt is not None:
        # Sent before (its receipt says so, or the owner did): answered from the receipt, not sent again.
        return receipt.get("excerpt"), Evidence({**asked, "action": action.pk, "replayed": True,
                                                 "status": receipt.get("status", "done before"), "receipt": receipt})
    actions.begin(ctx.recorder, ctx.run.pk, action)
    try:
        response = ctx.http(asked["method"], spec["url"], headers=spec.get("headers", {}), body=spec.get("body"))
    except (Blocked, ConnectionRefusedError) as exc:
        actions.fail(ctx.recorder, action, {"sent": False, "error": str(exc)[:actions.RECEIPT_EXCERPT]}, str(exc))
        raise StepFailed(f"request failed: {exc}", evidence=Evidence({**asked, "action": action.pk, "error": str(exc)})) from exc
    except OSError as exc:
        # Sent or not, nobody knows (a reset, a timeout): the owner says what happened.
        actions.uncertain(ctx.recorder, action, f"request failed: {exc}")
        raise actions.ActionUnknown(action) from exc
    body = response["body"]
    receipt = {"status": response["status"], "bytes": len(body), "digest": actions.receipt_digest(body),
               "excerpt": bounded(body, chars=actions.RECEIPT_EXCERPT)}
    if response["status"] >= 400:
        actions.fail(ctx.recorder, action, receipt, f"HTTP {response['status']}")
    else:
        actions.succeed(ctx.recorder, action, receipt)
    return http_answer(response, {**asked, "action": action.pk})


def http_answer(response: dict[str, Any], asked: dict[str, Any]) -> tuple[Any, Evidence]:
    """An ``http`` step's value (the body, parsed when it is JSON) and its evidence; a status of
    400 or more fails the step with the page's text."""
    body = response["body"]
    evidence = Evidence({**asked, "status": response["status"], "bytes": len(body), "body": bounded(body)})
    if response["status"] >= 400:
        raise StepFailed(f"HTTP {response['status']}", page_text=body, evidence=evidence)
    try:
        return json.loads(body), evidence
    except ValueError:
        return body, evidence


def call_tool(ctx: RunContext, name: str, args: Any, *, approved: bool = False, position: str = "call",
              replays: list[dict[str, Any]] | None = None) -> Any:
    """A flow ``tool`` step: the one tool-call path (``tasks.tools.call``), its refusals and
    failures turned into the step's failure. ``NeedsApproval`` goes up to pause the flow,
    ``ActionUnknown`` to ask the owner."""

    try:
        return call(ctx, name, args, approved=frozenset({ApprovalKind.IRREVERSIBLE}) if approved else frozenset(),
                    position=position, replays=replays)
    except CallError as exc:
        raise StepFailed(exc.message) from exc


def write_regular(target: Path, content: str) -> None:
    """Write a regular file; a FIFO, socket or device at ``target`` is refused, never opened
    (opening a FIFO for writing would wait for a reader and pin the worker)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise StepFailed(f"'{target.name}' is not a regular file; a write step only writes regular files")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(target, flags, 0o666)
    with os.fdopen(fd, "wb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped in since the check above
            raise StepFailed(f"'{target.name}' is not a regular file; a write step only writes regular files")
        handle.truncate(0)
        handle.write(content.encode())


def check_time(ctx: RunContext) -> None:
    """``LimitReached`` once the task has used its running time (all runs together)."""
    left = ctx.time_left()
    if left is not None and left <= 0:
        limit = ctx.task.limit("max_elapsed_ms")
        raise LimitReached("max_elapsed_ms", f"the task used all of its running time (limits.max_elapsed_ms = {limit})",
                           f"raise limits.max_elapsed_ms above {limit} and retry the task")

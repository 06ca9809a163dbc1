"""The flow worker: interprets a task's flow (docs/internals/run-path.md#flows), one step at a time.

Each step's event is persisted before the next step begins, and so is the resume point, so a
retried run picks up at the first step not yet finished.
"""
from __future__ import annotations

import difflib
import json
import time
from datetime import datetime
from typing import Any

from django.utils import timezone

from tasks import pauses
from tasks.broker.protocol import CallError
from tasks.browser import kinds as browser_kinds
from tasks.browser.walls import looks_like_human_wall
from tasks.llm.client import KeyMissing, ModelError, NoModel
from tasks.models import EventKind, TaskEvent
from tasks.pauses import ApprovalKind
from tasks.run import receipts
from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed, bounded
from tasks.run.recorder import ACTIONS, LeaseLost
from tasks.spec.flows import EXECUTABLE_KINDS, STEP_KINDS, missing_names, step_kind
from tasks.states import WaitingFor
from tasks.tools.registry import NeedsApproval, call
from tasks.vault.facts import guess_kind, open_records, seal_records
from tasks.workers.asking import ask_model
from tasks.workers.base import ApprovalRequest, Continue, Done, Failed, Outcome, Paused, check_time, needs_key
from tasks.workers.browser_step import RunBrowser
from tasks.workers.file_steps import delete_step, inside, write_step
from tasks.workers.http_step import http_action, http_step, step_position
from tasks.workers.planner import after_owner, plan, replan
from tasks.workers.rescuer import rescue
from tasks.workers.run_step import from_step_receipt, run_step
from tasks.workers.values import substitute

GATES = ("approve", "checkpoint", "ask")

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
        self._browser = RunBrowser()

    def release_browser(self, paused: bool) -> None:
        """For a worker that runs steps through this one (the agent): its run is over."""
        self._browser.release(paused=paused)

    def run(self, ctx: RunContext) -> Outcome:
        """Run the flow; the run's browser (if a step started one) is closed whatever happens,
        except at a pause, which keeps it on its page (``RunBrowser.release``)."""
        outcome: Outcome | None = None
        try:
            outcome = self._run(ctx)
            amended = ctx.resume.get("amended")
            if amended and isinstance(outcome, (Paused, Continue)) and outcome.resume and "amended" not in outcome.resume:
                # The rescuer's amended steps stand for the rest of the task: the run after an
                # approval runs the step as amended, never the step it replaced.
                outcome.resume = {**outcome.resume, "amended": amended}
            return outcome
        finally:
            self._browser.release(paused=isinstance(outcome, Paused))

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
        # tasks.vault.facts.seal_records) and redacted only where they are shown.
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
        answered: list[Any] = []  # the result of the last step of this run that gave one
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
                # itself, tasks.tools.registry.call): past the limit, nothing is recorded.
                acts = STEP_KINDS[kind].acts and kind != "tool"
                ctx.recorder.step(describe(substitute(step, known), index, total) + (" (retry)" if started.get("retry") else ""),
                                  started, progress=index / total, counts=ACTIONS if acts else None)
            resolved = step[kind] if kind == "run" else substitute(step[kind], self._for_model(ctx, known) if kind == "model" else known)
            try:
                if receipt is not None:
                    result, evidence = from_step_receipt(ctx, step, receipt)
                else:
                    result, evidence = self._execute(ctx, kind, resolved, step, known=known, approved=is_approved, index=index,
                                                     position=step_position(index))
            except pauses.ActionUnknown as unknown:
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
                guard = {**guard, **need.guard, "step": index}
                detail = {**planned_action(ctx, kind, resolved, step, known), **(need.detail or {})}
                return self._ask_approval(index, need.kind, need.summary, guard, detail=detail, amount_cents=need.amount_cents)
            except browser_kinds.PaymentStop as stop:
                record_result(ctx, index, total, kind, began, clock, stop.evidence, error=stop.message)
                # Paying is never automatic: a person pays, and only cancel ends the task.
                return Paused(WaitingFor.CHECKPOINT, stop.message, resume={"step": index}, continuable=False)
            except StepFailed as exc:
                if ctx.stop.is_set():
                    raise LeaseLost("stopped") from exc
                record_result(ctx, index, total, kind, began, clock, exc.evidence, error=exc.message)
                wall = looks_like_human_wall(f"{exc.message}\n{exc.page_text}")
                if wall:
                    # Continuing re-runs this step, on the page the kept browser shows
                    # (tasks.browser.stepin); an OK the owner gave for it still holds.
                    kept, fields = self._browser.at_wall(wall)
                    retry: dict[str, Any] = {"step": index, **kept}
                    if is_approved:
                        retry.update(approved_step=index, only=only)
                    how = "a person must get past it (in the live view), then continue" if kept else \
                        "a person must get past it, then continue"
                    return Paused(WaitingFor.HUMAN, f"step {index + 1} hit {wall}; {how}", resume=retry, fields=fields)
                rescued = rescue(ctx, steps, index, exc.message, exc.evidence.data, resume)
                if rescued is not None:
                    return rescued
                if ctx.task.spent.get("plans"):
                    replanned = replan(ctx, steps, index, exc.message)
                    if replanned is not None:
                        return replanned
                return Failed(f"step {index + 1} ({kind}) failed: {exc.message}", recoverable=True,
                              hint="fix the cause and retry the task")
            answered[:] = [result]
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
        if ctx.task.spent.get("plans"):
            return planned_answer(ctx, steps, records, answered)
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
        ``run`` is (its receipt's, ``tasks.run.receipts``)."""
        if kind == "run":
            return run_step(ctx, value, step, known, index, call=call)
        if kind == "write":
            return write_step(ctx, value)
        if kind == "delete":
            return delete_step(ctx, value)
        if kind == "http":
            return http_step(ctx, value, step, index)
        if kind in browser_kinds.KINDS:
            return self._browser.execute(ctx, kind, value, step, known=known, approved=approved, index=index)
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


def planned_answer(ctx: RunContext, steps: list[dict[str, Any]], records: dict[str, Any], answered: list[Any]) -> Done:
    """A planned task ends with its answer, as an agent task does: the result of its last step
    that gave one (this run's, else the last value a step saved), shown and kept in
    ``records["answer"]``."""
    if answered:
        result = answered[0]
    else:
        saved = [s["save"] for s in steps if s.get("save") in records]
        result = records[saved[-1]] if saved else None
    if result in (None, ""):
        return Done(f"finished all {len(steps)} steps")
    answer = ctx.recorder.redactor.text(result if isinstance(result, str) else json.dumps(result, default=str))
    kept = {**(ctx.task.records or {}), "answer": bounded(answer, chars=20000)}
    ctx.recorder.event(EventKind.OUTPUT, f"answer: {answer[:400]}", {"answer": bounded(answer, chars=20000)}, records=kept)
    return Done(answer[:500])


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


def call_tool(ctx: RunContext, name: str, args: Any, *, approved: bool = False, position: str = "call",
              replays: list[dict[str, Any]] | None = None) -> Any:
    """A flow ``tool`` step: the one tool-call path (``tasks.tools.registry.call``), its refusals and
    failures turned into the step's failure. ``NeedsApproval`` goes up to pause the flow,
    ``ActionUnknown`` to ask the owner."""

    try:
        return call(ctx, name, args, approved=frozenset({ApprovalKind.IRREVERSIBLE}) if approved else frozenset(),
                    position=position, replays=replays)
    except CallError as exc:
        raise StepFailed(exc.message) from exc

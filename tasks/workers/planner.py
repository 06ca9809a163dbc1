"""The planner: a plain-language task with the flow worker (``"worker": "flow"``, a prompt and no
flow) is written into a flow by the model, checked by the same validator as ``POST /api/tasks``,
logged and stored as the task's flow before it runs; then the flow worker runs it.

A plan the validator rejects goes back to the model with the reason (at most ``PLAN_ATTEMPTS``
tries). After a step of a planned flow fails (and the rescuer, if any, did not save it), the
model replans the rest from the failure, at most ``MAX_REPLANS`` times; at the bound one inbox
question asks the owner, who may authorise one final replan. With no model the task waits for
``plan`` and points to the guide (``GET /api/describe``).

A planned step that deletes, sends, pays or acts irreversibly carries ``stop_before`` whether or
not the model wrote it (``tasks.workers.guards``). A planned task ends with its answer: the
result of its last step that gave one (``records["answer"]``, as an agent task's).
"""
from __future__ import annotations

import json
from typing import Any

from boxsite.core.errors import InvalidFlow
from tasks.llm.client import KeyMissing, ModelError, NoModel, current_config
from tasks.models import EventKind, Task
from tasks.run.context import RunContext
from tasks.spec.describe import guide
from tasks.spec.flows import validate_flow
from tasks.states import WaitingFor
from tasks.tools.registry import NeedsApproval
from tasks.workers.asking import ask_model
from tasks.workers.base import ApprovalRequest, Continue, Failed, Outcome, Paused, needs_key
from tasks.workers.guards import guard_planned

PLAN_ATTEMPTS = 3
MAX_REPLANS = 3
FINAL_REPLAN = "final_replan"  # the owner's answer at the bound: yes or no
NO_PLANNER = ("no model is configured, so this plain-language task cannot be planned; configure a model in "
              "Settings → Model, or write the flow yourself (the guide: GET /api/describe) and start a new task with it")


def _messages(ctx: RunContext, extra: str = "") -> list[dict[str, Any]]:
    task = ctx.task
    context = [f"The task: {task.title}\n{task.prompt}"]
    facts = ctx.facts.shown()
    if facts:
        context.append("Facts (use them as ${name}): " + ", ".join(sorted(facts)))
    context.append("Tools the task may call: " + (", ".join(task.tools) if task.tools else "none"))
    context.append("Hosts it may reach: " + (", ".join(task.hosts) if task.hosts else "none"))
    if extra:
        context.append(extra)
    return [
        {"role": "system", "content": "You plan tasks for the box: answer with one flow as JSON, following this guide.\n"
                                      + json.dumps(guide())},
        {"role": "user", "content": "\n\n".join(context)},
    ]


def write_plan(ctx: RunContext, *, extra: str = "", keep: list[dict[str, Any]] | None = None,
               resume: dict[str, Any] | None = None) -> dict[str, Any] | Outcome:
    """A valid flow from the model (``keep``: steps that stay in front of the new ones), or the
    outcome that stops the run (a pause for the budget or a key, a failure)."""
    try:
        config = current_config()
    except NoModel:
        return Paused(WaitingFor.PLAN, NO_PLANNER, resume={})
    messages = ctx.recorder.redactor.redact(_messages(ctx, extra))
    problem = ""
    for attempt in range(1, PLAN_ATTEMPTS + 1):
        try:
            decision, answer = ask_model(ctx, messages, purpose="plan", schema={"type": "object"}, config=config)
        except KeyMissing as exc:
            return needs_key(exc.key_name, "the configured model (to plan the task)", resume or {})
        except NeedsApproval as need:
            return Paused(WaitingFor.APPROVAL, need.summary, resume=resume or {},
                          approval=ApprovalRequest(need.kind, need.summary, need.detail, need.guard, need.amount_cents))
        except ModelError as exc:
            return Failed(f"the planner failed: {exc.message}", recoverable=True,
                          hint="check Settings → Model (Test connection), then retry the task")
        flow = {**answer, "steps": [*(keep or []), *answer.get("steps", [])]} if isinstance(answer.get("steps"), list) else answer
        try:
            validate_flow(flow)
        except InvalidFlow as exc:
            problem = exc.message
            ctx.recorder.note(f"plan {attempt} rejected: {problem}"[:300], {"plan": answer, "rejected": problem, "attempt": attempt})
            messages = [*messages, decision.message(),
                        {"role": "user", "content": f"That flow is not valid: {problem}. Answer with a corrected flow (JSON only)."}]
            continue
        # The model's own stop_before is not the only guard: a step that deletes, sends, pays or
        # acts irreversibly stops for the owner's OK whatever the plan says.
        kept = len(keep or [])
        flow["steps"] = [*flow["steps"][:kept], *(guard_planned(s) for s in flow["steps"][kept:])]
        return flow
    return Failed(f"the planner's flow was rejected {PLAN_ATTEMPTS} times; the last reason: {problem}", recoverable=True,
                  hint="describe the task more precisely, or write the flow yourself (GET /api/describe)")


def adopt(ctx: RunContext, flow: dict[str, Any], summary: str) -> None:
    """Store ``flow`` as the task's flow and log it (the task window and the report show it)."""
    def write() -> None:
        Task.objects.filter(pk=ctx.task.pk).update(flow=flow)
        ctx.task.flow = flow
    ctx.recorder.guarded(write)
    ctx.recorder.event(EventKind.NOTE, summary, {"plan": flow, "steps": len(flow["steps"])}, doing_now=True)


def plan(ctx: RunContext) -> Outcome | None:
    """Plan a task that has no flow yet; None once the flow is adopted (the worker runs it)."""
    flow = write_plan(ctx)
    if not isinstance(flow, dict):
        return flow
    ctx.recorder.count("plans", None)
    adopt(ctx, flow, f"planned {len(flow['steps'])} steps")
    return None


def replan(ctx: RunContext, steps: list[dict[str, Any]], index: int, error: str) -> Outcome | None:
    """After step ``index`` of a planned flow failed: replan the rest (within the bound), ask the
    owner at the bound, or None (the failure stands)."""
    used = int(ctx.task.spent.get("replans", 0))
    if used >= MAX_REPLANS:
        if int(ctx.task.spent.get("final_replans", 0)) > 0:
            return None
        why = (f"step {index + 1} failed ({error[:200]}) and the planner has replanned {MAX_REPLANS} times; "
               "answer yes to allow one final replan, no to let the task fail")
        return Paused(WaitingFor.INPUT, "the planner reached its replan limit",
                      resume={"step": index, "replan_after": error[:1000], "ask_owner": True},
                      fields=[{"name": FINAL_REPLAN, "why": why, "kind": "text", "options": ["yes", "no"]}])
    return _replan(ctx, steps, index, error, counter="replans")


def after_owner(ctx: RunContext, steps: list[dict[str, Any]], index: int, error: str) -> Outcome:
    """The owner answered the question at the bound."""
    if str(ctx.facts.values.get(FINAL_REPLAN, "")).strip().lower() != "yes":
        return Failed(f"step {index + 1} failed: {error}; the owner did not allow another replan", recoverable=True,
                      hint="fix the cause, then retry the task")
    return _replan(ctx, steps, index, error, counter="final_replans") or Failed(f"step {index + 1} failed: {error}", recoverable=True)


def _replan(ctx: RunContext, steps: list[dict[str, Any]], index: int, error: str, *, counter: str) -> Outcome | None:
    done = steps[:index]
    extra = (f"The flow so far (steps 1-{index} are done and stay):\n{json.dumps(done)}\n\nStep {index + 1} failed: "
             f"{json.dumps(steps[index])}\nError: {error}\n\nWrite only the steps that finish the task from here.")
    flow = write_plan(ctx, extra=extra, keep=done, resume={"step": index, "replan_after": error})
    if not isinstance(flow, dict):
        return flow
    ctx.recorder.count(counter, None)
    adopt(ctx, flow, f"replanned from step {index + 1} ({counter.replace('_', ' ')} {ctx.task.spent.get(counter)})")
    return Continue(resume={"step": index, "amended": {}})  # the new flow has no amended steps


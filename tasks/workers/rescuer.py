"""The rescuer: when a flow step fails recoverably (and it is not a wall only a person can pass),
the configured model sees the redacted failure and the flow so far, and decides: retry (the
same step, or an amended one), skip it, or give up.

Each rescue counts against ``max_rescues`` (default 5, also the most a task may set), is one
model call like any other (budget, ``max_model_calls``), and is logged as a ``note`` whose data
carries ``rescue`` (the report's ``rescues``). Retrying or skipping goes on in a new run
(``Continue``) from the resume point, which carries the amended step (``resume["amended"]``).
An amended step keeps the guard of the step it replaces (``tasks.workers.guards.keep_guard``):
whatever the model wrote, it does not run on an OK given for another step.
"""
from __future__ import annotations

import json
from typing import Any

from boxsite.core.errors import InvalidFlow
from tasks.llm.client import KeyMissing, ModelError, NoModel, current_config
from tasks.run.context import RunContext
from tasks.run.evidence import bounded
from tasks.spec.flows import step_kind, validate_flow
from tasks.tools.registry import NeedsApproval
from tasks.workers.asking import ask_model
from tasks.workers.base import Continue, Failed, Outcome
from tasks.workers.guards import keep_guard

DECISION_SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "enum": ["retry", "skip", "give_up"]},
        "step": {"type": "object", "description": "for retry: the step to run instead (same language as the flow)"},
        "reason": {"type": "string"},
    },
    "required": ["decision", "reason"],
}


def rescues_left(ctx: RunContext) -> int:
    limit = ctx.task.limit("max_rescues") or 0
    return max(0, limit - int(ctx.task.spent.get("rescues", 0)))


def rescue(ctx: RunContext, steps: list[dict[str, Any]], index: int, error: str, evidence: dict[str, Any],
           resume: dict[str, Any]) -> Outcome | None:
    """What the rescuer decided for step ``index`` that failed with ``error``; None when no
    rescue is attempted (no model, no rescues left), so the step's failure stands."""
    if rescues_left(ctx) <= 0:
        return None
    try:
        config = current_config()
    except NoModel:
        return None
    ctx.recorder.count("rescues", "max_rescues")
    redact = ctx.recorder.redactor
    failed = steps[index]
    so_far = [{"step": i + 1, **({"outcome": "done"} if i < index else {"outcome": "failed"} if i == index else {"outcome": "not reached"}),
               "definition": s} for i, s in enumerate(steps)]
    messages = [
        {"role": "system", "content": "You rescue a step of an automated task that failed. Decide: 'retry' (optionally "
                                      "with an amended 'step' written in the same flow language), 'skip' (the task can "
                                      "do without it), or 'give_up'. Values appear as ${name}; keep them that way."},
        {"role": "user", "content": f"The task: {ctx.task.title}\n{ctx.task.prompt}\n\nThe flow so far:\n"
                                    + json.dumps(so_far)[:30_000]
                                    + f"\n\nStep {index + 1} failed: {error}\nWhat it did:\n" + json.dumps(bounded(evidence))},
    ]
    try:
        decision, answer = ask_model(ctx, redact.redact(messages), purpose="rescue", schema=DECISION_SCHEMA, config=config)
    except (KeyMissing, ModelError, NeedsApproval) as exc:
        ctx.recorder.note(f"rescue of step {index + 1} not possible: {exc}"[:300],
                          {"rescue": {"step": index + 1, "decision": "none", "reason": str(exc)}})
        return None
    choice = answer["decision"]
    reason = str(answer.get("reason", ""))[:1000]
    record: dict[str, Any] = {"step": index + 1, "decision": choice, "reason": reason, "error": error,
                              "usage": decision.usage.shown()}
    amended = answer.get("step") if choice == "retry" else None
    if amended is not None:
        try:
            validate_flow({"steps": [amended]})
        except InvalidFlow as exc:
            record.update(decision="give_up", reason=f"the amended step is not valid: {exc}", amended=amended)
            ctx.recorder.note(f"rescue of step {index + 1}: the amended step is not valid", {"rescue": record})
            return Failed(f"step {index + 1} failed: {error}; the rescuer's amended step is not valid: {exc}", recoverable=True,
                          hint="fix the step and run the task again")
        before = steps[index - 1] if index > 0 else {}
        approved = resume.get("approved_step") == index or (bool(before) and step_kind(before) == "approve")
        amended = keep_guard(failed, amended, approved=approved)
        record["amended"] = amended
    ctx.recorder.note(f"rescue of step {index + 1}: {choice}" + (f" ({reason[:200]})" if reason else ""), {"rescue": record})
    if choice == "retry":
        kept = {k: v for k, v in resume.items() if k not in ("approved_step", "only")}
        amendments = dict(kept.get("amended") or {})
        if amended is not None:
            amendments[str(index)] = amended
        return Continue(resume={**kept, "step": index, "amended": amendments})
    if choice == "skip":
        return Continue(resume={**{k: v for k, v in resume.items() if k not in ("approved_step", "only")}, "step": index + 1})
    return Failed(f"step {index + 1} failed: {error}; the rescuer gave up: {reason}", recoverable=True,
                  hint="fix the cause, then retry the task")

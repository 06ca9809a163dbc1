"""One model call on behalf of a task: budget first, then the call, then its cost.

Used by ``model`` flow steps and the other model-driven parts of a flow task. The messages are
redacted here once more before they leave (a value a step printed, a vault key), a call whose
estimated cost would cross the budget raises ``NeedsApproval`` (spending) before it is made,
each call counts against ``max_model_calls``, and an answer asked for with a JSON Schema is
checked against it (one more call, told what was wrong, before ``ModelError``).
"""
from __future__ import annotations

import json
from typing import Any

import jsonschema

from tasks import budget
from tasks.llm.client import Decision, ModelConfig, ModelError, call_model, current_config, read_key
from tasks.pauses import ApprovalKind
from tasks.run.context import RunContext
from tasks.tools.registry import NeedsApproval


def ask_model(ctx: RunContext, messages: list[dict[str, Any]], *, purpose: str, schema: dict[str, Any] | None = None,
              config: ModelConfig | None = None) -> tuple[Decision, Any]:
    """The decision and the answer: the parsed JSON (checked against ``schema``) or the text.
    Raises ``NoModel``, ``KeyMissing``, ``ModelError``, ``NeedsApproval`` or ``LimitReached``."""
    config = config or current_config()
    key = read_key(config)
    sent = ctx.recorder.redactor.redact(messages)
    if schema is not None:
        sent = [*sent, {"role": "system", "content": "Answer with one JSON value only, following this JSON Schema:\n"
                        + json.dumps(schema)}]
    for attempt in (1, 2):
        decision = _one_call(ctx, config, key, sent, purpose)
        if schema is None:
            return decision, decision.content
        try:
            answer = decision.json_answer()
            jsonschema.validate(answer, schema)
            return decision, answer
        except (ModelError, jsonschema.ValidationError) as exc:
            problem = exc.message
            if attempt == 2:
                raise ModelError(f"the model's answer does not follow the schema: {problem}", kind="schema") from exc
            sent = [*sent, decision.message(), {"role": "user", "content": f"That answer does not follow the schema: {problem}. "
                                                "Answer again with JSON only."}]
    raise AssertionError("unreachable")


def _one_call(ctx: RunContext, config: ModelConfig, key: str, sent: list[dict[str, Any]], purpose: str) -> Decision:
    try:
        budget.admit_model_call(ctx.recorder, config.estimate_cents(sent))
    except budget.OverBudget as exc:
        raise NeedsApproval(
            ApprovalKind.SPENDING,
            f"{purpose}: the model call may cost up to {exc.cents}¢ and would cross the {exc.budget_cents}¢ budget; "
            f"allow {exc.needed_cents}¢ more",
            guard={"model_call": purpose, "budget_cents": exc.budget_cents}, amount_cents=exc.needed_cents,
            detail={"model": config.model, "cost_cents": exc.cents, "spent_cents": exc.spent_cents, "budget_cents": exc.budget_cents},
        ) from exc
    decision = call_model(config, sent, key=key, recorder=ctx.recorder)
    budget.charge_model(ctx.recorder, decision.cost_cents, f"{purpose}: {config.model}", decision.usage.shown())
    return decision

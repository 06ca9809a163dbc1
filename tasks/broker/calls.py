"""What each broker op does. Every write goes through the run's step recorder (lease-bound)."""
from __future__ import annotations

import re
from typing import Any

from tasks import budget, pauses
from tasks.broker.holds import Holds
from tasks.broker.protocol import CallError, text_arg
from tasks.models import EventKind
from tasks.pauses import ApprovalKind, QuestionKind
from tasks.run.context import RunContext
from tasks.states import WaitingFor
from tasks.tools import delegation
from tasks.tools import registry as tools
from tasks.vault.facts import guess_kind

FACT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
MAX_SPEND_CENTS = 10_000_000  # a sanity bound: a typo should not ask the owner for $100k


class Calls:
    def __init__(self, ctx: RunContext, holds: Holds) -> None:
        self.ctx = ctx
        self.holds = holds

    def dispatch(self, message: dict[str, Any]) -> Any:
        op = message["op"]
        handler = getattr(self, f"op_{op}")
        return handler(message)

    def op_ping(self, message: dict[str, Any]) -> Any:
        return {"task": self.ctx.task.pk, "run": self.ctx.run.number}

    def op_step(self, message: dict[str, Any]) -> Any:
        text = text_arg(message, "text", max_len=2000)
        progress = message.get("progress")
        if progress is not None and (isinstance(progress, bool) or not isinstance(progress, (int, float)) or not 0 <= progress <= 1):
            raise CallError("'progress' must be a number from 0 to 1", field="progress")
        self.ctx.recorder.step(text, {"via": "box"}, progress=progress)
        return {"recorded": True}

    def op_tool(self, message: dict[str, Any]) -> Any:
        name = text_arg(message, "name", max_len=200)
        args = message.get("args", {})
        approved: set[ApprovalKind] = set()
        while True:
            try:
                return tools.call(self.ctx, name, args, approved=frozenset(approved))
            except tools.NeedsApproval as need:
                # Approved kinds are remembered for exactly this call, so it goes ahead once.
                self.holds.approval(need.kind, need.summary, guard=need.guard, detail=need.detail,
                                    amount_cents=need.amount_cents)
                approved.add(need.kind)
            except pauses.ActionUnknown as unknown:
                # The process waits for the owner's word; then the call answers from it (the
                # receipt, a second attempt, or the task ends).
                action_id = unknown.action.pk
                self.holds.question(WaitingFor.HUMAN, QuestionKind.ACTION, f"{unknown}; did it happen?",
                                    pauses.actions().reconcile_fields(),
                                    opened=lambda q: pauses.actions().link_question(action_id, q))

    def op_spend(self, message: dict[str, Any]) -> Any:
        cents = message.get("cents")
        if isinstance(cents, bool) or not isinstance(cents, int) or not 0 < cents <= MAX_SPEND_CENTS:
            raise CallError(f"'cents' must be a whole number from 1 to {MAX_SPEND_CENTS}", field="cents")
        reason = text_arg(message, "reason", max_len=500)
        while True:
            try:
                budget.admit(self.ctx.recorder, cents, f"spend {cents}¢: {reason}", {"reason": reason, "via": "box"})
            except budget.OverBudget as exc:
                self.holds.approval(
                    ApprovalKind.SPENDING, f"spend {cents}¢ ({reason}), which would cross the {exc.budget_cents}¢ budget; allow {exc.needed_cents}¢ more",
                    guard={"spend": cents, "reason": reason}, amount_cents=exc.needed_cents,
                    detail={"cents": cents, "reason": reason, "spent_cents": exc.spent_cents, "budget_cents": exc.budget_cents},
                )
                continue  # the budget was raised: admit again (and pause again if others spent meanwhile)
            return {"spent_cents": cents}

    def op_approve(self, message: dict[str, Any]) -> Any:
        text = text_arg(message, "text", max_len=500)
        self.holds.approval(ApprovalKind.IRREVERSIBLE, text, guard={"approve": text}, detail={"via": "box"})
        return {"approved": True}

    def op_ask(self, message: dict[str, Any]) -> Any:
        name = text_arg(message, "name", max_len=100)
        if not FACT_NAME.match(name):
            raise CallError(f"'{name}' is not a usable name (letters, digits, _ . -)", field="name")
        why = text_arg(message, "why", max_len=500)
        known = self.ctx.facts.values.get(name)
        if known not in (None, ""):
            return {"value": known}
        kind = message.get("kind") or guess_kind(name)
        if kind not in ("text", "email", "phone", "date", "number"):
            raise CallError("'kind' must be text, email, phone, date or number", field="kind")
        field: dict[str, Any] = {"name": name, "why": why, "kind": kind, "options": []}
        return self.holds.question(WaitingFor.INPUT, QuestionKind.INPUT, f"the task asks for {name}: {why}", [field], name=name)

    def op_need_human(self, message: dict[str, Any]) -> Any:
        text = text_arg(message, "text", max_len=500)
        self.ctx.recorder.event(EventKind.NOTE, f"a person is needed: {text}", {"via": "box"})
        result = self.holds.question(WaitingFor.HUMAN, QuestionKind.HUMAN, text, [])
        return {"continued": True, **result}

    def op_task(self, message: dict[str, Any]) -> Any:
        child = delegation.create_child(self.ctx, message.get("spec"))
        return {"task": child.pk, "state": child.state, "parent": self.ctx.task.pk}

    def op_schedule(self, message: dict[str, Any]) -> Any:
        return delegation.create("schedule", self.ctx, message.get("schedule"))

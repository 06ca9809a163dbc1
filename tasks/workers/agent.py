"""The agent worker: a plain-language task run by the configured model in a tool-calling loop.

The model is given the task, the box's rules (budget, approvals, the payment rule) and tools:
run a command, list/read/write files, an HTTP request through the task's host policy, the broker
tools the task lists, ask the owner, request approval, finish. Each tool call executes in the
worker as the task's user inside its sandbox and copy, through the same code as the flow's
steps (``tasks.workers.flow``); the tools and their dispatch are ``tasks.workers.agent_tools``,
this module is the loop that asks the model.

Every model turn is a step in the log: the messages sent since the last turn (redacted), the
model's decision, its usage and cost, then each tool call and its result. The conversation is
saved as the resume point after every turn, so a pause (an approval, a question, the budget)
holds no worker and the next run goes on from there.

Secrets reach the model only as ``${name}``: shared facts are given by value, secret facts and
vault values by name; tool arguments get their values only when they execute, and every result
is masked before it goes back (``Redactor``). With no model configured the task waits for a
plan (``NO_MODEL``).
"""
from __future__ import annotations

import json
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from tasks import budget
from tasks.llm.client import (
    Decision,
    KeyMissing,
    ModelConfig,
    ModelError,
    NoModel,
    ToolCall,
    call_model,
    current_config,
    read_key,
)
from tasks.models import EventKind
from tasks.pauses import ApprovalKind
from tasks.run.context import RunContext
from tasks.run.evidence import TAIL_CHARS, TAIL_LINES, StepFailed, bounded
from tasks.states import WaitingFor
from tasks.tools.registry import get_tool
from tasks.workers import agent_browser, context_window
from tasks.workers.agent_tools import BUILTIN_FUNCTIONS, ToolDispatch, Turn, tool_function_name
from tasks.workers.base import ApprovalRequest, Failed, Outcome, Paused, check_time, needs_key
from tasks.workers.file_steps import inside
from tasks.workers.flow import FlowWorker
from tasks.workers.replies import read_reply, without_thinking

NO_MODEL = ("no model is configured, so this plain-language task cannot be planned; "
            "configure a model in Settings → Model, or start the task again with a 'flow' or a command worker")
MAX_BROKEN = 3  # broken tool calls in a row before the task fails
AGENTS_MD_CHARS = 16000
PAYMENT_RULES = {
    "stop_at_payment": "Never pay: stop in front of the control that pays and ask for approval.",
    "fill_then_approve": "Fill the payment form from the secrets, then stop in front of the control that pays and ask for approval.",
}

def is_broken_call(exc: ModelError) -> bool:
    """True when the endpoint's answer was refused for a tool call's arguments (not JSON, not an
    object): the model's mistake, for it to fix, not the endpoint's failure."""
    return exc.kind == "arguments"


class AgentWorker:
    def run(self, ctx: RunContext) -> Outcome:
        try:
            config = current_config()
        except NoModel:
            return Paused(WaitingFor.PLAN, NO_MODEL, resume={})
        try:
            key = read_key(config)
        except KeyMissing as exc:
            return needs_key(exc.key_name, "the configured model", ctx.resume)
        ctx.refresh_redactor()
        state = dict(ctx.resume.get("agent") or {})
        if not state:
            state = {"messages": self._opening(ctx, config), "turn": 0, "logged": 0, "pending": [], "approved": None}
        tools = self._functions(ctx)
        loop = AgentLoop(ctx, config, key, tools, state)
        return loop.go()

    def _opening(self, ctx: RunContext, config: ModelConfig) -> list[dict[str, Any]]:
        task = ctx.task
        rules = [
            "You are the box's agent. You do the owner's task with the tools you are given, then call finish with your answer.",
            f"Budget: {task.budget_cents} cents in all; spending more waits for the owner's OK.",
            "Irreversible actions (deleting, sending, publishing, paying) need the owner's OK first: call request_approval.",
            PAYMENT_RULES.get(str(task.constraints.get("payment", "stop_at_payment")), PAYMENT_RULES["stop_at_payment"]),
            "Secret values are shown to you only as ${name}; write ${name} where one is needed and the box substitutes it.",
            "Do not guess values you were not given: ask the owner.",
            # The environment's rules: what a model would otherwise learn by failing.
            "Each run_command is a fresh /bin/sh in the task's own copy of the files: the working directory, variables "
            f"and background processes do not carry over. A command is stopped after {settings.BOX_AGENT_COMMAND_TIMEOUT_S:g} s "
            "unless you give timeout_s: never start a server or a watcher in the foreground.",
            "The network: only the hosts listed below are reachable; every other connection is refused. "
            "HTTP requests other than GET/HEAD wait for the owner's OK, and so do curl/wget commands that send "
            "(another method, or data) to a listed host.",
            f"Output: a command's result shows the last {TAIL_LINES} lines (at most {TAIL_CHARS} characters) of stdout and "
            f"stderr; a longer tool result than {context_window.result_chars(config.context_tokens)} characters is shown as its head and tail, and "
            "the whole of it is kept: page through it with read_output. Redirect long output to a file and read or search it.",
            "Files: read_file (start_line/end_line for part of a long file), edit_file to change exact text, "
            "search_files and glob_files to find things, write_file for new files.",
        ]
        guide = self._agents_md(ctx)
        if guide:
            rules.append(f"The workspace's AGENTS.md (the owner's instructions for agents working here):\n{guide}")
        facts = ctx.facts.shown()
        user = task.prompt
        if facts:
            user += "\n\nFacts you may use:\n" + "\n".join(f"- {name}: {value}" for name, value in facts.items())
        hosts = ", ".join(task.hosts) if task.hosts else "none"
        user += f"\n\nHosts this task may reach: {hosts}."
        return ctx.recorder.redactor.redact([{"role": "system", "content": "\n".join(rules)}, {"role": "user", "content": user}])

    @staticmethod
    def _agents_md(ctx: RunContext) -> str:
        """The ``AGENTS.md`` at the top of the task's files, bounded; empty when there is none."""
        try:
            path = inside(ctx.workdir, "AGENTS.md")
            if not path.is_file():
                return ""
            text = path.read_bytes()[:AGENTS_MD_CHARS * 4].decode("utf-8", "replace")
        except (StepFailed, OSError):
            return ""
        return text[:AGENTS_MD_CHARS] + (" … (cut)" if len(text) > AGENTS_MD_CHARS else "")

    def _functions(self, ctx: RunContext) -> list[dict[str, Any]]:
        functions = [*BUILTIN_FUNCTIONS, *agent_browser.functions(ctx)]
        for name in ctx.task.tools or []:
            tool = get_tool(name)
            if tool is None:
                continue
            schema = tool.schema if tool.schema.get("type") == "object" else {"type": "object"}
            functions.append({"type": "function", "function": {
                "name": tool_function_name(name),
                "description": f"The box tool {name}: {tool.description}" + (" (acts irreversibly: the owner's OK is asked first)" if tool.irreversible else ""),
                "parameters": schema}})
        return functions


class AgentLoop(ToolDispatch):
    def __init__(self, ctx: RunContext, config: ModelConfig, key: str, tools: list[dict[str, Any]], state: dict[str, Any]) -> None:
        self.ctx = ctx
        self.config = config
        self.key = key
        self.tools = tools
        self.state = state
        self.by_function = {tool_function_name(n): n for n in ctx.task.tools or []}
        self.by_name = {t["function"]["name"]: t["function"] for t in tools}
        self.flow = FlowWorker()  # its browser is the run's, shared by the browser tools' calls

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.state["messages"]
        return messages

    def go(self) -> Outcome:
        """The loop; the run's browser (if a call started one) is released as the run ends, and
        kept only at a pause in front of a payment."""
        outcome: Outcome | None = None
        try:
            outcome = self._go()
            return outcome
        finally:
            self.flow.release_browser(paused=isinstance(outcome, Paused))

    def _go(self) -> Outcome:
        ended = self._pending()
        if ended is not None:
            return ended
        while True:
            check_time(self.ctx)
            ended = self._fit()
            if ended is not None:
                return ended
            try:
                budget.check_model_call(self.ctx.recorder, self.config.estimate_cents(self.messages, self.tools))
            except budget.OverBudget as exc:
                return self._pause_spending(exc)
            turn = self.state["turn"] + 1
            began, clock = timezone.now(), time.monotonic()
            sent = self.messages[self.state["logged"]:]
            # The turn's step counts the call (past ``max_model_calls`` nothing is logged and the run fails).
            self.ctx.recorder.step(f"turn {turn}: asking the model", {
                "step": turn, "kind": "model", "model": self.config.model, "messageCount": len(self.messages),
                "sent": [bounded(m, chars=4000) for m in sent]}, counts=budget.MODEL_CALLS)
            self.state["turn"] = turn
            self.state["logged"] = len(self.messages)
            try:
                decision = call_model(self.config, self.ctx.recorder.redactor.redact(self.messages), tools=self.tools, key=self.key, recorder=self.ctx.recorder)
            except ModelError as exc:
                if not is_broken_call(exc) or exc.decision is None:
                    self._result(turn, began, clock, {"error": exc.message, "errorKind": exc.kind}, ok=False,
                                 summary=f"turn {turn}: the model failed: {exc.message}")
                    return Failed(f"the model failed: {exc.message}", recoverable=True,
                                  hint="check Settings → Model (Test connection), then retry the task")
                # Arguments that are not JSON: the answer is paid for like any other, and each broken
                # call is answered as its tool result (``_pending``), so the model writes it again.
                decision = exc.decision
            estimated = " (usage estimated: the endpoint reported none)" if decision.usage.estimated else ""
            charged = budget.charge_model(self.ctx.recorder, decision.cost_cents, f"model turn {turn}{estimated}",
                                          {"step": turn, **decision.usage.shown()})
            self._result(turn, began, clock, {"decision": decision.shown(), "usage": decision.usage.shown(),
                                              "costCents": round(decision.cost_cents, 4), "chargedCents": charged},
                         ok=True, summary=f"turn {turn}: {self._words(decision)}{estimated}")
            reply = read_reply(decision.content, prefix=f"text-{turn}")
            calls = decision.tool_calls or reply.calls
            if not calls and reply.problems:
                ended = self._broken(reply.problems[0])
                if ended is not None:
                    return ended
                self.messages.append(self.ctx.recorder.redactor.redact(decision.message()))
                self.messages.append({"role": "user", "content": f"Your last answer could not be used: {reply.problems[0]}. "
                                                                 "Call the tool again with valid JSON."})
                continue
            if not calls and (not reply.text or decision.finish_reason == "length"):
                ended = self._nudge(decision, reply.text)
                if ended is not None:
                    return ended
                continue
            self.state["nudged"] = False
            # A call written as text goes back to the model as a structured call, so its result pairs with it.
            said: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            if calls:
                said["tool_calls"] = [c.message() for c in calls]
            self.messages.append(self.ctx.recorder.redactor.redact(said))
            if not calls:
                return self._finish(reply.text)
            self.state["pending"] = [{"id": c.id, "name": c.name, "arguments": c.arguments,
                                      **({"problem": c.problem} if c.problem else {})} for c in calls]
            ended = self._pending()
            if ended is not None:
                return ended

    def _fit(self) -> Outcome | None:
        """Near the context window, compact the older turns into a summary (one model call of its
        own, logged and charged); the rules, the task and the recent turns stay whole."""
        limit, window = self.config.max_output_tokens, self.config.context_tokens
        if not context_window.needs_compaction(self.messages, self.tools, limit, window):
            return None
        start = context_window.split(self.messages, self.tools, limit, window)
        if start is None:
            return None
        older = self.messages[2:start]
        request = self.ctx.recorder.redactor.redact(context_window.summary_request(older, limit, window))
        try:
            budget.admit_model_call(self.ctx.recorder, self.config.estimate_cents(request))
        except budget.OverBudget as exc:
            return self._pause_spending(exc)
        before = context_window.count_tokens(self.messages, self.tools)
        began, clock = timezone.now(), time.monotonic()
        data = {"step": self.state["turn"], "kind": "compaction", "model": self.config.model, "messages": len(older),
                "tokensBefore": before, "window": context_window.window_tokens(window)}
        self.ctx.recorder.step(f"compacting {len(older)} earlier messages ({before} tokens) to fit the context", data)
        try:
            decision = call_model(self.config, request, key=self.key)
        except ModelError as exc:
            self.ctx.recorder.event(EventKind.STEP_RESULT, f"compaction failed: {exc.message}"[:300],
                                    {**data, "ok": False, "error": exc.message})
            return Failed(f"the conversation outgrew the model's context and compacting it failed: {exc.message}",
                          recoverable=True, hint="check Settings → Model (Test connection), then retry the task")
        charged = budget.charge_model(self.ctx.recorder, decision.cost_cents,
                                      "compaction" + (" (usage estimated)" if decision.usage.estimated else ""),
                                      decision.usage.shown())
        summary = without_thinking(decision.content) or "(the summariser gave nothing)"
        self.messages[2:start] = [{"role": "user", "content": context_window.SUMMARY_PREFIX + summary}]
        logged = int(self.state["logged"])
        self.state["logged"] = logged - (start - 3) if logged >= start else 2
        after = context_window.count_tokens(self.messages, self.tools)
        self.ctx.recorder.event(EventKind.STEP_RESULT, f"compacted {len(older)} messages: {before} → {after} tokens", {
            **data, "ok": True, "tokensAfter": after, "usage": decision.usage.shown(), "costCents": round(decision.cost_cents, 4),
            "chargedCents": charged, "startedAt": began.isoformat(), "durationMs": int((time.monotonic() - clock) * 1000)})
        self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)})
        return None

    def _nudge(self, decision: Decision, text: str) -> Outcome | None:
        """An empty answer, or one cut at the output limit, is never the task's answer: the model
        is asked once to go on; a second in a row fails the task (recoverable), naming the cut."""
        cut = decision.finish_reason == "length"
        what = ("the model's answer was cut at its output limit (finish_reason: length)" if cut
                else "the model gave an empty answer")
        if self.state.get("nudged"):
            return Failed(f"{what}, twice in a row", recoverable=True,
                          hint="raise the model's output limit or use a model that answers, then retry the task" if cut
                          else "check the model in Settings → Model (Test connection), then retry the task")
        self.state["nudged"] = True
        if text:
            self.messages.append(self.ctx.recorder.redactor.redact({"role": "assistant", "content": text}))
        self.messages.append({"role": "user", "content": ("Your answer was cut off" if cut else "Your answer was empty")
                                                         + ": continue, or finish with an answer (call finish)."})
        self.ctx.recorder.note(f"{what}: the model is asked to go on", {"nudge": "length" if cut else "empty"})
        return None

    def _broken(self, problem: str) -> Outcome | None:
        """Count a tool call the model got wrong; the task fails (recoverable) at ``MAX_BROKEN`` in a row."""
        self.state["broken"] = int(self.state.get("broken", 0)) + 1
        if self.state["broken"] >= MAX_BROKEN:
            return Failed(f"the model made {MAX_BROKEN} broken tool calls in a row; the last: {problem}"[:1000], recoverable=True,
                          hint="retry the task, or use a model that calls tools reliably (Settings → Model)")
        return None

    def _pending(self) -> Outcome | None:
        """Execute the tool calls of the last turn not yet answered; an outcome when one ends the run.
        The conversation is saved as each call is answered; with none to answer, once at the end."""
        answered = False
        while self.state["pending"]:
            raw = self.state["pending"][0]
            call = ToolCall(id=raw["id"], name=raw["name"], arguments=raw["arguments"], problem=raw.get("problem", ""))
            approved = self.state.get("approved") == call.id
            problem = self._problem(call)
            if problem is not None:
                # Answered as the call's result, so the model sees what was wrong and fixes it.
                self._log_call(call, {"error": problem})
                ended = self._broken(problem)
                if ended is not None:
                    return ended
                turn = Turn(content=json.dumps({"error": problem}))
            else:
                self.state["broken"] = 0
                turn = self.execute(call, approved=approved)
            if turn.outcome is not None:
                if isinstance(turn.outcome, Paused):
                    # Approving runs exactly this call (a denial ends the task instead).
                    self.state["approved"] = call.id if turn.outcome.waiting_for == WaitingFor.APPROVAL else None
                    turn.outcome.resume = {"agent": self.ctx.recorder.redactor.redact(self.state)}
                return turn.outcome
            self.state["pending"].pop(0)
            self.state["approved"] = None
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": turn.content})
            if not turn.saved:
                self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)})
            answered = True
        if not answered:  # the last call's save holds the state as it is now
            self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)})
        return None

    # --- helpers --------------------------------------------------------------------------

    def _pause_spending(self, exc: budget.OverBudget) -> Paused:
        summary = (f"the next model call may cost up to {exc.cents}¢ and would cross the {exc.budget_cents}¢ budget; "
                   f"allow {exc.needed_cents}¢ more")
        return Paused(WaitingFor.APPROVAL, summary, resume={"agent": self.ctx.recorder.redactor.redact(self.state)},
                      approval=ApprovalRequest(ApprovalKind.SPENDING, summary,
                                               {"model": self.config.model, "cost_cents": exc.cents, "spent_cents": exc.spent_cents,
                                                "budget_cents": exc.budget_cents},
                                               {"model_call": self.state["turn"] + 1, "budget_cents": exc.budget_cents},
                                               exc.needed_cents))

    def _result(self, turn: int, began: Any, clock: float, data: dict[str, Any], *, ok: bool, summary: str) -> None:
        self.ctx.recorder.event(EventKind.STEP_RESULT, summary[:300], {
            "step": turn, "kind": "model", "ok": ok, "startedAt": began.isoformat(),
            "durationMs": int((time.monotonic() - clock) * 1000), **data})

    @staticmethod
    def _words(decision: Decision) -> str:
        if decision.tool_calls:
            return "the model calls " + ", ".join(c.name for c in decision.tool_calls)
        return "the model answers: " + decision.content[:200]

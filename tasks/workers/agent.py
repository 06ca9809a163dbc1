"""The agent worker: a plain-language task run by the configured model in a tool-calling loop.

The model is given the task, the box's rules (budget, approvals, the payment rule) and tools:
run a command, list/read/write files, an HTTP request through the task's host policy, the broker
tools the task lists, ask the owner, request approval, finish. Each tool call executes in the
worker as the task's user inside its sandbox and copy, through the same code as the flow's
steps (``tasks.workers.flow``).

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
from dataclasses import dataclass
from typing import Any

import jsonschema
from django.conf import settings
from django.utils import timezone

from boxsite.core.errors import NotFound
from tasks import budget, pauses
from tasks.browser.kinds import ACTING as BROWSER_ACTING
from tasks.browser.kinds import KINDS as BROWSER_KINDS
from tasks.browser.kinds import PaymentStop
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
from tasks.run import artifacts, receipts
from tasks.run.context import RunContext
from tasks.run.evidence import TAIL_CHARS, TAIL_LINES, Evidence, StepFailed, bounded
from tasks.states import WaitingFor
from tasks.tools.registry import NeedsApproval, get_tool
from tasks.vault.facts import guess_kind
from tasks.workers import agent_browser, agent_files, context_window
from tasks.workers.base import ApprovalRequest, Done, Failed, Outcome, Paused, check_time, needs_key
from tasks.workers.file_steps import inside
from tasks.workers.flow import FlowWorker
from tasks.workers.guards import command_writes, sends
from tasks.workers.replies import read_reply, without_thinking
from tasks.workers.run_step import from_step_receipt
from tasks.workers.values import substitute

NO_MODEL = ("no model is configured, so this plain-language task cannot be planned; "
            "configure a model in Settings → Model, or start the task again with a 'flow' or a command worker")
MAX_BROKEN = 3  # broken tool calls in a row before the task fails
LIST_ENTRIES = 500
AGENTS_MD_CHARS = 16000
PAYMENT_RULES = {
    "stop_at_payment": "Never pay: stop in front of the control that pays and ask for approval.",
    "fill_then_approve": "Fill the payment form from the secrets, then stop in front of the control that pays and ask for approval.",
}

_OBJECT = {"type": "object", "additionalProperties": False}


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {**_OBJECT, "properties": properties, "required": required}}}


BUILTIN_FUNCTIONS = [
    _fn("run_command", "Run a shell command in the task's working directory (its own copy of the files). "
        "Write ${name} where a secret value goes; the box puts the value in when the command runs.",
        {"command": {"type": "string"}, "timeout_s": {"type": "integer", "minimum": 1}}, ["command"]),
    _fn("list_files", "List the entries of a directory of the task's files ('.' is the top).",
        {"path": {"type": "string"}}, []),
    _fn("read_file", "Read a text file of the task's files; with start_line/end_line (from 1, both included), "
        "just those lines, numbered.",
        {"path": {"type": "string"}, "start_line": {"type": "integer", "minimum": 1},
         "end_line": {"type": "integer", "minimum": 1}}, ["path"]),
    _fn("edit_file", "Edit a text file of the task's files: replace the exact text old_string (whitespace included) "
        "with new_string. old_string must be found exactly once, unless replace_all is true.",
        {"path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"},
         "replace_all": {"type": "boolean"}}, ["path", "old_string", "new_string"]),
    _fn("search_files", "Search the task's files for lines matching a regular expression (like grep -rn); "
        "answers path:line: text, at most 200 matches.",
        {"pattern": {"type": "string"}, "path": {"type": "string", "description": "a file or directory; default '.'"},
         "glob": {"type": "string", "description": "only files matching this, e.g. '*.py'"}}, ["pattern"]),
    _fn("glob_files", "List the task's files matching a glob pattern ('**' for any depth, e.g. 'src/**/*.py').",
        {"pattern": {"type": "string"}}, ["pattern"]),
    _fn("write_file", "Write (create or replace) a text file of the task's files.",
        {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    _fn("http_request", "Make an HTTP request; only the hosts the task lists are reachable.",
        {"method": {"type": "string"}, "url": {"type": "string"}, "headers": {"type": "object"}, "body": {}}, ["url"]),
    _fn("ask_owner", "Ask the owner for a value you need and cannot find; the task waits for the answer.",
        {"name": {"type": "string", "description": "a short name for the value, e.g. 'delivery address'"},
         "question": {"type": "string"}}, ["name", "question"]),
    _fn("request_approval", "Ask the owner's OK before an irreversible action (deleting, sending, publishing, paying); "
        "the task waits for the decision.",
        {"action": {"type": "string", "description": "exactly what you will do once approved"}}, ["action"]),
    _fn("read_output", "Read lines of a tool result that was shown cut (its whole is kept under the name the cut result gives).",
        {"name": {"type": "string"}, "start_line": {"type": "integer", "minimum": 1},
         "end_line": {"type": "integer", "minimum": 1}}, ["name", "start_line"]),
    _fn("finish", "Finish the task with your answer for the owner.", {"answer": {"type": "string"}}, ["answer"]),
]


def is_broken_call(exc: ModelError) -> bool:
    """True when the endpoint's answer was refused for a tool call's arguments (not JSON, not an
    object): the model's mistake, for it to fix, not the endpoint's failure."""
    return exc.kind == "arguments"


def tool_function_name(tool: str) -> str:
    return "tool_" + tool.replace(".", "__")


@dataclass
class Turn:
    """What one tool call gave back: the text the model sees, or the outcome that ends the run."""

    content: str = ""
    outcome: Outcome | None = None


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
            state = {"messages": self._opening(ctx), "turn": 0, "logged": 0, "pending": [], "approved": None}
        tools = self._functions(ctx)
        loop = AgentLoop(ctx, config, key, tools, state)
        return loop.go()

    def _opening(self, ctx: RunContext) -> list[dict[str, Any]]:
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
            f"stderr; a longer tool result than {context_window.result_chars()} characters is shown as its head and tail, and "
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


class AgentLoop:
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
                budget.admit_model_call(self.ctx.recorder, self.config.estimate_cents(self.messages, self.tools))
            except budget.OverBudget as exc:
                return self._pause_spending(exc)
            self.state["turn"] += 1
            turn = self.state["turn"]
            began, clock = timezone.now(), time.monotonic()
            sent = self.messages[self.state["logged"]:]
            self.ctx.recorder.step(f"turn {turn}: asking the model", {
                "step": turn, "kind": "model", "model": self.config.model, "messageCount": len(self.messages),
                "sent": [bounded(m, chars=4000) for m in sent]})
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
        limit = self.config.max_output_tokens
        if not context_window.needs_compaction(self.messages, self.tools, limit):
            return None
        start = context_window.split(self.messages, self.tools, limit)
        if start is None:
            return None
        older = self.messages[2:start]
        request = self.ctx.recorder.redactor.redact(context_window.summary_request(older, limit))
        try:
            budget.admit_model_call(self.ctx.recorder, self.config.estimate_cents(request))
        except budget.OverBudget as exc:
            return self._pause_spending(exc)
        before = context_window.count_tokens(self.messages, self.tools)
        began, clock = timezone.now(), time.monotonic()
        data = {"step": self.state["turn"], "kind": "compaction", "model": self.config.model, "messages": len(older),
                "tokensBefore": before, "window": context_window.window_tokens()}
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
        """Execute the tool calls of the last turn not yet answered; an outcome when one ends the run."""
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
            self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)})
        self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)})
        return None

    # --- the tools ------------------------------------------------------------------------

    def _problem(self, call: ToolCall) -> str | None:
        """What is wrong with ``call`` before it runs: a tool the model was not given, or
        arguments its schema refuses; None when it may run."""
        if call.problem:
            return call.problem
        function = self.by_name.get(call.name)
        if function is None:
            return f"there is no tool '{call.name}'; the tools are: {', '.join(sorted(self.by_name))}"
        try:
            jsonschema.validate(call.arguments, function["parameters"])
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            return f"the arguments of {call.name} do not fit its schema: {exc.message}" + (f" (at {where})" if where else "")
        return None

    def execute(self, call: ToolCall, *, approved: bool) -> Turn:
        ctx = self.ctx
        args = call.arguments
        if call.name == "finish":
            return Turn(outcome=self._finish(str(args.get("answer", ""))))
        if call.name == "ask_owner":
            return self._ask(call)
        if call.name == "request_approval":
            action = str(args.get("action", "an irreversible action"))
            if approved:
                self._log_call(call, {"approved": True})
                return Turn(content=f"The owner approved: {action}. Go ahead.")
            return Turn(outcome=Paused(
                WaitingFor.APPROVAL, f"the agent asks: {action}", approval=ApprovalRequest(
                    ApprovalKind.IRREVERSIBLE, action[:300], {"action": action}, {"tool_call": call.id})))
        step, kind = self._as_step(call)
        if step is None:
            self._log_call(call, {"error": kind})
            return Turn(content=json.dumps({"error": kind}))
        if kind == "http" and "stop_before" in step and not approved and not ctx.task.constraints.get("allow_destructive"):
            # Anything but GET/HEAD changes something out there: the owner's OK first.
            request = step["http"]
            summary = f"the agent sends HTTP {str(request.get('method')).upper()} {request['url']}"[:300]
            return Turn(outcome=Paused(WaitingFor.APPROVAL, summary, approval=ApprovalRequest(
                ApprovalKind.IRREVERSIBLE, summary,
                {"action": "http", "method": str(request.get("method")).upper(), "url": request["url"],
                 **({"body": bounded(request["body"])} if request.get("body") is not None else {}), "call": call.id},
                {"tool_call": call.id})))
        if kind == "run" and not approved and not ctx.task.constraints.get("allow_destructive") \
                and command_writes(step["run"], list(ctx.task.hosts or [])):
            # The same rule as http_request: curl/wget sending to a listed host waits for the owner's OK.
            summary = f"the agent's command sends over the network: {step['run']}"[:300]
            return Turn(outcome=Paused(WaitingFor.APPROVAL, summary, approval=ApprovalRequest(
                ApprovalKind.IRREVERSIBLE, summary, {"action": "run", "command": bounded(step["run"]), "call": call.id},
                {"tool_call": call.id})))
        known = dict(ctx.facts.values)
        ctx.recorder.event(EventKind.TOOL_CALL, f"{call.name} {self._brief(args)}", {"call": call.id, "tool": call.name, "args": bounded(args)},
                           doing_now=True)
        if kind in ("run", "write", "edit", "http") or (kind in BROWSER_ACTING and kind != "tab"):
            ctx.recorder.count("actions", "max_actions")
        try:
            result, evidence = self._run(kind, step, known, approved=approved, call=call.id)
        except NeedsApproval as need:
            return Turn(outcome=Paused(
                WaitingFor.APPROVAL, need.summary, approval=ApprovalRequest(
                    need.kind, need.summary, {**need.detail, "call": call.id}, {**need.guard, "tool_call": call.id}, need.amount_cents)))
        except PaymentStop as stop:
            # Paying is never automatic: a person pays, and only cancel ends the task.
            ctx.recorder.event(EventKind.TOOL_RESULT, f"{call.name} stopped: {stop.message}"[:300],
                               {"call": call.id, "tool": call.name, "ok": False, "error": stop.message, **stop.evidence.data},
                               artifacts=stop.evidence.artifacts)
            return Turn(outcome=Paused(WaitingFor.CHECKPOINT, stop.message, continuable=False))
        except pauses.ActionUnknown as unknown:
            # Never called again by itself: the owner says what happened; the next run comes
            # back to this call and answers from what they said.
            return Turn(outcome=Paused(WaitingFor.HUMAN, f"{unknown}; did it happen?", reconcile=unknown.action.pk))
        except StepFailed as exc:
            data = {"call": call.id, "tool": call.name, "ok": False, "error": exc.message, **exc.evidence.data}
            ctx.recorder.event(EventKind.TOOL_RESULT, f"{call.name} failed: {exc.message}"[:300], data, artifacts=exc.evidence.artifacts)
            self._recorded(kind)
            return Turn(content=self._shown({"error": exc.message, **exc.evidence.data}, exc.evidence.artifacts))
        ctx.recorder.event(EventKind.TOOL_RESULT, f"{call.name} ok", {"call": call.id, "tool": call.name, "ok": True, **evidence.data},
                           artifacts=evidence.artifacts)
        self._recorded(kind)
        return Turn(content=self._shown(result if kind in ("list", "read", "edit", "search", "glob", "output", "tool")
                                        else {"result": result, **evidence.data}, evidence.artifacts))

    def _as_step(self, call: ToolCall) -> tuple[dict[str, Any] | None, str]:
        args = call.arguments
        if call.name == "run_command" and isinstance(args.get("command"), str):
            # Every command has a timeout: a server the model starts in the foreground is stopped, not waited for.
            timeout = args.get("timeout_s") if isinstance(args.get("timeout_s"), int) else settings.BOX_AGENT_COMMAND_TIMEOUT_S
            return {"run": args["command"], "timeout_s": timeout}, "run"
        if call.name == "list_files":
            return {"list": str(args.get("path") or ".")}, "list"
        if call.name == "read_file" and isinstance(args.get("path"), str):
            return {"read": args["path"], "start_line": args.get("start_line"), "end_line": args.get("end_line")}, "read"
        if call.name == "edit_file":
            return {"edit": dict(args)}, "edit"
        if call.name == "search_files":
            return {"search": dict(args)}, "search"
        if call.name == "glob_files":
            return {"glob": args["pattern"]}, "glob"
        if call.name == "read_output":
            return {"output": dict(args)}, "output"
        if call.name == "write_file" and isinstance(args.get("path"), str) and isinstance(args.get("content"), str):
            return {"write": {"path": args["path"], "content": args["content"]}}, "write"
        if call.name == "http_request" and isinstance(args.get("url"), str):
            spec = {k: args[k] for k in ("method", "url", "headers", "body") if k in args}
            if sends(spec.get("method")):  # sent at most once, on the owner's OK (tasks.workers.http_step)
                return {"http": spec, "stop_before": "the agent's request changes something"}, "http"
            return {"http": spec}, "http"
        if call.name in agent_browser.NAMES:
            return agent_browser.as_step(call.name, args)
        if call.name in self.by_function:
            return {"tool": self.by_function[call.name], "args": args}, "tool"
        return None, f"there is no tool '{call.name}' with those arguments; use the tools you were given"

    def _recorded(self, kind: str) -> None:
        """A command's result is in the log: its receipt goes (``tasks.run.receipts``)."""
        if kind == "run":
            receipts.discard(self.ctx.task.pk, self.state["turn"] - 1)

    def _run(self, kind: str, step: dict[str, Any], known: dict[str, Any], *, approved: bool,
             call: str = "") -> tuple[Any, Evidence]:
        ctx = self.ctx
        if kind == "list":
            relative = step["list"]
            target = ctx.workdir if relative in (".", "", "./") else inside(ctx.workdir, relative)
            if not target.is_dir():
                raise StepFailed(f"'{relative}' is not a directory")
            entries = sorted(target.iterdir(), key=lambda p: p.name)[:LIST_ENTRIES]
            listed = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries]
            return {"path": relative, "entries": listed}, Evidence({"path": relative, "entries": len(listed)})
        if kind == "read":
            return agent_files.read_file(ctx, step["read"], step.get("start_line"), step.get("end_line"))
        if kind == "edit":
            edit = step["edit"]
            return agent_files.edit_file(ctx, edit["path"], edit["old_string"], edit["new_string"], bool(edit.get("replace_all")))
        if kind == "search":
            search = step["search"]
            return agent_files.search_files(ctx, search["pattern"], str(search.get("path") or "."), search.get("glob"))
        if kind == "glob":
            return agent_files.glob_files(ctx, step["glob"])
        if kind == "output":
            wanted = step["output"]
            try:
                path = artifacts.artifact_file(ctx.task.pk, str(wanted["name"]))
            except NotFound as exc:
                raise StepFailed(f"there is no output '{wanted['name']}'") from exc
            return agent_files.read_lines(path, str(wanted["name"]), wanted["start_line"], wanted.get("end_line"))
        value = step[kind]
        if kind != "run":
            value = substitute(value, known)
        index = self.state["turn"] - 1
        if kind in BROWSER_KINDS:  # each browser call its own evidence names
            self.state["browser_calls"] = index = int(self.state.get("browser_calls", 0)) + 1
        # A lost run whose command had ended left its receipt: the command is not run again.
        receipt = receipts.find(ctx, index, call=call) if kind == "run" and ctx.run.number > 1 else None
        if receipt is not None:
            return from_step_receipt(ctx, step, receipt)
        return self.flow._execute(ctx, kind, value, step, known=known, approved=approved, index=index, call=call)

    def _ask(self, call: ToolCall) -> Turn:
        name = str(call.arguments.get("name", "")).strip()[:100] or "answer"
        question = str(call.arguments.get("question", "")).strip()[:400] or f"the agent needs {name}"
        value = self.ctx.facts.values.get(name)
        if value not in (None, ""):
            shown = "${" + name + "}" if name in self.ctx.facts.secret_names else value
            self._log_call(call, {"answered": True})
            return Turn(content=json.dumps({"name": name, "value": shown}))
        field = {"name": name, "why": question, "kind": guess_kind(name), "options": []}
        return Turn(outcome=Paused(WaitingFor.INPUT, question, fields=[field]))

    # --- helpers --------------------------------------------------------------------------

    def _finish(self, answer: str) -> Outcome:
        answer = self.ctx.recorder.redactor.text(without_thinking(answer))
        self.ctx.recorder.output(f"answer: {answer[:400]}", {"answer": bounded(answer, chars=20000)})
        records = {**(self.ctx.task.records or {}), "answer": bounded(answer, chars=20000)}
        self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)}, records=records)
        return Done(answer[:500] or "finished")

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

    def _log_call(self, call: ToolCall, result: dict[str, Any]) -> None:
        self.ctx.recorder.event(EventKind.TOOL_CALL, f"{call.name} {self._brief(call.arguments)}",
                                {"call": call.id, "tool": call.name, "args": bounded(call.arguments), **result})

    def _shown(self, value: Any, kept: list[dict[str, Any]] | None = None) -> str:
        """A result as the model sees it: masked, then its head and tail within the budget; the
        whole of a longer one is an artifact the model reads with ``read_output`` (``kept``: the
        artifacts a step already saved, such as a command's whole stdout)."""
        value = self.ctx.recorder.redactor.redact(value)
        text = json.dumps(value, default=str)
        budget = context_window.result_chars()
        if len(text) <= budget:
            return text
        if kept:
            names = " and ".join(f"'{a['name']}'" for a in kept)
            return context_window.head_and_tail(text, budget, f"the whole output is output {names}: "
                                                              "call read_output with its name and start_line/end_line")
        self.state["outputs"] = int(self.state.get("outputs", 0)) + 1
        name = f"agent-output-{self.state['outputs']}.txt"
        # Written out field by field, so the model can page through a command's output by line.
        whole = "\n".join(f"{k}:\n{v}" if isinstance(v, str) else f"{k}: {json.dumps(v, default=str)}"
                          for k, v in value.items()) if isinstance(value, dict) else text
        listing = artifacts.save_text(self.ctx.task.pk, name, whole, self.ctx.recorder.redactor)
        self.ctx.recorder.event(EventKind.NOTE, f"a tool result of {len(text)} characters is shown cut; the whole is {name}",
                               {"output": name, "chars": len(text)}, artifacts=[listing])
        lines = whole.count("\n") + 1
        return context_window.head_and_tail(text, budget, f"the whole result ({lines} lines) is output '{name}': "
                                                          "call read_output with its name and start_line/end_line")

    @staticmethod
    def _brief(args: dict[str, Any]) -> str:
        for key in ("command", "path", "url", "name", "action"):
            if isinstance(args.get(key), str):
                return args[key][:200]
        return json.dumps(args)[:200]

    @staticmethod
    def _words(decision: Decision) -> str:
        if decision.tool_calls:
            return "the model calls " + ", ".join(c.name for c in decision.tool_calls)
        return "the model answers: " + decision.content[:200]

"""The built-in agent's tools: the functions offered to the model, and running one call.

``BUILTIN_FUNCTIONS`` are the tools every agent task has; ``ToolDispatch`` checks a call
against its schema, runs it as a flow step of the same kind (``tasks.workers.flow``) in the
task's sandbox and copy, asks first where a guard says so (``tasks.workers.guards``), and gives
back what the model sees: masked, and cut to its head and tail within the budget with the whole
kept as an artifact. The loop that asks the model is ``tasks.workers.agent``.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from boxsite.core.errors import NotFound
from tasks import pauses
from tasks.browser.kinds import ACTING as BROWSER_ACTING
from tasks.browser.kinds import KINDS as BROWSER_KINDS
from tasks.browser.kinds import PaymentStop
from tasks.llm.client import ModelConfig, ToolCall
from tasks.models import EventKind
from tasks.pauses import ApprovalKind
from tasks.run import artifacts, receipts
from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed, bounded
from tasks.run.recorder import ACTIONS
from tasks.states import WaitingFor
from tasks.tools.registry import NeedsApproval
from tasks.vault.facts import guess_kind
from tasks.workers import agent_browser, agent_files, context_window
from tasks.workers.base import ApprovalRequest, Done, Outcome, Paused
from tasks.workers.file_steps import inside
from tasks.workers.flow import FlowWorker
from tasks.workers.guards import command_writes, sends
from tasks.workers.replies import without_thinking
from tasks.workers.run_step import from_step_receipt
from tasks.workers.values import substitute

LIST_ENTRIES = 500

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


def tool_function_name(tool: str) -> str:
    return "tool_" + tool.replace(".", "__")


@dataclass
class Turn:
    """What one tool call gave back: the text the model sees, or the outcome that ends the run."""

    content: str = ""
    outcome: Outcome | None = None
    saved: bool = False  # the conversation with this call answered is saved already (with its result's event)


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A checked validator for a tool's parameters (given as sorted JSON), made once: checking
    the schema itself is what ``jsonschema.validate`` spends most of its time on, every call."""
    schema = json.loads(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class ToolDispatch:
    """The tool side of ``tasks.workers.agent.AgentLoop``: what the loop is, its tool calls run
    through (the loop sets these attributes)."""

    ctx: RunContext
    state: dict[str, Any]
    by_name: dict[str, dict[str, Any]]  # function name -> the function offered to the model
    by_function: dict[str, str]  # function name -> the broker tool it calls
    flow: FlowWorker
    config: ModelConfig  # the run's model settings, read once as it starts (its context window)

    def _problem(self, call: ToolCall) -> str | None:
        """What is wrong with ``call`` before it runs: a tool the model was not given, or
        arguments its schema refuses; None when it may run."""
        if call.problem:
            return call.problem
        function = self.by_name.get(call.name)
        if function is None:
            return f"there is no tool '{call.name}'; the tools are: {', '.join(sorted(self.by_name))}"
        exc = best_match(_validator(json.dumps(function["parameters"], sort_keys=True)).iter_errors(call.arguments))
        if exc is not None:
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
        acts = kind in ("run", "write", "edit", "http") or (kind in BROWSER_ACTING and kind != "tab")
        # The action is counted by the call's own write, as a flow step's is: past the limit nothing is logged.
        ctx.recorder.event(EventKind.TOOL_CALL, f"{call.name} {self._brief(args)}", {"call": call.id, "tool": call.name, "args": bounded(args)},
                           doing_now=True, counts=ACTIONS if acts else None)
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
            return self._answered(call, kind, {"error": exc.message, **exc.evidence.data}, exc.evidence.artifacts,
                                  f"{call.name} failed: {exc.message}"[:300], data)
        return self._answered(call, kind, result if kind in ("list", "read", "edit", "search", "glob", "output", "tool")
                              else {"result": result, **evidence.data}, evidence.artifacts,
                              f"{call.name} ok", {"call": call.id, "tool": call.name, "ok": True, **evidence.data})

    def _answered(self, call: ToolCall, kind: str, value: Any, kept: list[dict[str, Any]] | None,
                  summary: str, data: dict[str, Any]) -> Turn:
        """Log a call's result and save the conversation with it answered, in one write: a run cut
        off between the two would run the call again whose result the log already shows. A cut
        result's whole is saved before (the answer names it), its note logged after."""
        content, note = self._shown_later(value, kept)
        after = {**self.state, "pending": self.state["pending"][1:], "approved": None,
                 "messages": [*self.state["messages"], {"role": "tool", "tool_call_id": call.id, "content": content}]}
        self.ctx.recorder.event(EventKind.TOOL_RESULT, summary, data, artifacts=kept,
                                resume={"agent": self.ctx.recorder.redactor.redact(after)})
        if note is not None:
            note()
        self._recorded(kind)
        return Turn(content=content, saved=True)

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

    def _finish(self, answer: str) -> Outcome:
        answer = self.ctx.recorder.redactor.text(without_thinking(answer))
        self.ctx.recorder.output(f"answer: {answer[:400]}", {"answer": bounded(answer, chars=20000)})
        records = {**(self.ctx.task.records or {}), "answer": bounded(answer, chars=20000)}
        self.ctx.recorder.save_progress(resume={"agent": self.ctx.recorder.redactor.redact(self.state)}, records=records)
        return Done(answer[:500] or "finished")

    def _log_call(self, call: ToolCall, result: dict[str, Any]) -> None:
        self.ctx.recorder.event(EventKind.TOOL_CALL, f"{call.name} {self._brief(call.arguments)}",
                                {"call": call.id, "tool": call.name, "args": bounded(call.arguments), **result})

    def _shown_later(self, value: Any, kept: list[dict[str, Any]] | None = None) -> tuple[str, Callable[[], None] | None]:
        """A result as the model sees it: masked, then its head and tail within the budget; the
        whole of a longer one is an artifact the model reads with ``read_output`` (``kept``: the
        artifacts a step already saved, such as a command's whole stdout). With the note that
        says so, for the caller to log after the result (None: nothing to note)."""
        value = self.ctx.recorder.redactor.redact(value)
        text = json.dumps(value, default=str)
        budget = context_window.result_chars(self.config.context_tokens)
        if len(text) <= budget:
            return text, None
        if kept:
            names = " and ".join(f"'{a['name']}'" for a in kept)
            return context_window.head_and_tail(text, budget, f"the whole output is output {names}: "
                                                              "call read_output with its name and start_line/end_line"), None
        self.state["outputs"] = int(self.state.get("outputs", 0)) + 1
        name = f"agent-output-{self.state['outputs']}.txt"
        # Written out field by field, so the model can page through a command's output by line.
        whole = "\n".join(f"{k}:\n{v}" if isinstance(v, str) else f"{k}: {json.dumps(v, default=str)}"
                          for k, v in value.items()) if isinstance(value, dict) else text
        listing = artifacts.save_text(self.ctx.task.pk, name, whole, self.ctx.recorder.redactor)

        def note() -> None:
            self.ctx.recorder.event(EventKind.NOTE, f"a tool result of {len(text)} characters is shown cut; the whole is {name}",
                                    {"output": name, "chars": len(text)}, artifacts=[listing])

        lines = whole.count("\n") + 1
        return context_window.head_and_tail(text, budget, f"the whole result ({lines} lines) is output '{name}': "
                                                          "call read_output with its name and start_line/end_line"), note

    @staticmethod
    def _brief(args: dict[str, Any]) -> str:
        for key in ("command", "path", "url", "name", "action"):
            if isinstance(args.get(key), str):
                return args[key][:200]
        return json.dumps(args)[:200]

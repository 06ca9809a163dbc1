"""The tool registry and the one way a task calls a tool.

A tool is a name, a JSON Schema for its arguments, a cost per call in cents, whether a call acts
irreversibly (and so needs the owner's OK unless the task allows destructive steps), and an
implementation ``impl(ctx, args) -> result``. Apps register tools in code (``register``); owners
add command-backed tools in a JSON file named by ``BOX_TOOLS_FILE`` (see ``tasks.tools.builtin``),
re-read whenever the file changes.

``call`` is the path every tool call takes, from the broker (the ``box`` client) and from flow
``tool`` steps: refuse tools the task does not list, validate the arguments, ask for approval
when the call is irreversible or would cross the budget (``NeedsApproval``, before anything is
done), count it against ``max_actions``, record ``tool_call``/``cost``/``tool_result`` events.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tasks import budget, pauses
from tasks.broker.protocol import InvalidArgs, ToolFailed, ToolRefused
from tasks.models import EventKind
from tasks.pauses import ActionKind, ActionState, ApprovalKind
from tasks.run.evidence import bounded
from tasks.run.recorder import LeaseLost, LimitReached
from tasks.tools.builtin import BUILTIN_TOOLS, command_tool
from tasks.tools.types import NAME_RE, Tool

if TYPE_CHECKING:
    from tasks.run.context import RunContext


class NeedsApproval(Exception):
    """The call may not go ahead without the owner's OK. Nothing has been done or charged."""

    def __init__(self, kind: ApprovalKind, summary: str, *, guard: dict[str, Any], detail: dict[str, Any] | None = None,
                 amount_cents: int = 0) -> None:
        super().__init__(summary)
        self.kind = kind
        self.summary = summary
        self.guard = guard
        self.detail = detail or {}
        self.amount_cents = amount_cents


_BUILTIN: dict[str, Tool] = {}
_owner_tools: dict[str, Tool] = {}
_owner_source: tuple[str, int] | None = None  # (path, mtime_ns) the owner tools were read from


def register(tool: Tool) -> Tool:
    """Declare a tool provided by the box or an app (call at import time)."""
    if not NAME_RE.match(tool.name):
        raise ImproperlyConfigured(f"tool name {tool.name!r} must look like 'group.name' (lowercase)")
    _BUILTIN[tool.name] = tool
    return tool


for _tool in BUILTIN_TOOLS:
    register(_tool)


def _load_owner_tools() -> dict[str, Tool]:
    """The owner's command tools, re-read when BOX_TOOLS_FILE changes (path or contents)."""
    global _owner_tools, _owner_source
    path = getattr(settings, "BOX_TOOLS_FILE", None)
    if not path:
        _owner_tools, _owner_source = {}, None
        return _owner_tools
    try:
        source = (str(path), Path(path).stat().st_mtime_ns)
    except OSError as exc:
        raise ImproperlyConfigured(f"BOX_TOOLS_FILE {path!r} cannot be read: {exc}") from exc
    if source == _owner_source:
        return _owner_tools
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"BOX_TOOLS_FILE {path!r} is not a JSON list of tools: {exc}") from exc
    if not isinstance(entries, list):
        raise ImproperlyConfigured(f"BOX_TOOLS_FILE {path!r} must hold a JSON list of tools")
    loaded: dict[str, Tool] = {}
    for entry in entries:
        tool = command_tool(entry)
        if tool.name in _BUILTIN:
            raise ImproperlyConfigured(f"BOX_TOOLS_FILE: '{tool.name}' is a built-in tool and cannot be replaced")
        loaded[tool.name] = tool
    _owner_tools, _owner_source = loaded, source
    return _owner_tools


def get_tool(name: str) -> Tool | None:
    return _BUILTIN.get(name) or _load_owner_tools().get(name)


def all_tools() -> list[Tool]:
    return sorted({**_load_owner_tools(), **_BUILTIN}.values(), key=lambda t: t.name)


def check_call(task: Any, name: str, args: Any) -> Tool:
    """The tool, if ``task`` may call it with ``args``; else ``ToolRefused``/``InvalidArgs``."""
    if name not in (task.tools or []):
        listed = ", ".join(task.tools) if task.tools else "none"
        raise ToolRefused(f"tool '{name}' is not in this task's tools (it may call: {listed})", field="tool")
    tool = get_tool(name)
    if tool is None:
        raise ToolRefused(f"no installed app provides tool '{name}'", field="tool")
    if not isinstance(args, dict):
        raise InvalidArgs(f"arguments for '{name}' must be a JSON object", field="args")
    try:
        jsonschema.validate(args, tool.schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise InvalidArgs(f"bad arguments for '{name}': {exc.message}" + (f" (at {where})" if where else ""),
                          field=f"args.{where}" if where else "args") from exc
    return tool


def call(ctx: RunContext, name: str, args: Any, *, approved: frozenset[ApprovalKind] = frozenset(),
         position: str = "call", replays: list[dict[str, Any]] | None = None) -> Any:
    """Call tool ``name`` for the task in ``ctx``; returns the tool's result (a call answered
    from an earlier call's receipt appends its action and receipt to ``replays``, when given).

    ``approved`` holds the approval kinds the owner already gave for exactly this call
    (``"irreversible"``, ``"spending"``). Raises ``NeedsApproval`` before acting when one is
    missing, ``ToolRefused``/``InvalidArgs`` for calls the task may not make (recorded),
    ``ToolFailed`` when the tool ran and failed (recorded), ``LimitReached`` past max_actions.

    An irreversible tool's call is an action (``approvals.actions``) found again by ``position``
    (a flow's ``step:N``; ``call`` for a process's calls, so the same call with the same
    arguments in one task is one action): attempted at most once, its receipt answered again
    instead of a second call, ``ActionUnknown`` when an earlier attempt was cut off mid-call.
    """
    recorder = ctx.recorder
    try:
        tool = check_call(ctx.task, name, args)
    except (ToolRefused, InvalidArgs) as exc:
        recorder.event(EventKind.TOOL_CALL, f"{name} refused: {exc.message}",
                       {"tool": name, "args": args if isinstance(args, dict) else {}, "refused": exc.message})
        raise
    guard: dict[str, Any] = {"tool": name, "args": args}
    action = None
    if tool.acts_irreversibly(args):
        allowed = bool(ctx.task.constraints.get("allow_destructive"))
        action = pauses.actions().propose(recorder, ctx.run.pk, kind=ActionKind.TOOL, target=name, position=position, args=args,
                                          policy=pauses.actions().policy_of(ctx.task, tool=name, costCents=tool.cost_cents))
        try:
            receipt = pauses.actions().replayed_receipt(action)
        except pauses.ActionFailedBefore as before:
            raise ToolFailed(f"tool '{name}' failed before and is not called again: {before.action.error}",
                             field="tool") from before
        if receipt is not None:
            recorder.event(EventKind.TOOL_RESULT, f"{name}: done before (action {action.pk}), not called again",
                           {"tool": name, "ok": True, "action": action.pk, "replayed": True, "receipt": receipt})
            if replays is not None:
                replays.append({"action": action.pk, "receipt": receipt})
            return receipt.get("result")
        if action.state == ActionState.PROPOSED and not allowed and ApprovalKind.IRREVERSIBLE not in approved:
            raise NeedsApproval(ApprovalKind.IRREVERSIBLE, f"call {name}, which acts irreversibly",
                                guard={**guard, "action": action.pk}, detail={"tool": name, "args": args})

    def record_call() -> None:
        recorder.event(EventKind.TOOL_CALL, name, {"tool": name, "args": args, "cost_cents": tool.cost_cents,
                                                   **({"action": action.pk} if action else {})}, doing_now=True)

    try:
        budget.admit(recorder, tool.cost_cents, f"{name}: {tool.cost_cents}¢", {"tool": name},
                     counter=("actions", "max_actions"), before_cost=record_call)
    except budget.OverBudget as exc:
        raise NeedsApproval(ApprovalKind.SPENDING, f"{name} costs {exc.cents}¢ and would cross the {exc.budget_cents}¢ budget; "
                            f"allow {exc.needed_cents}¢ more", guard=guard, amount_cents=exc.needed_cents,
                            detail={"tool": name, "cost_cents": exc.cents, "spent_cents": exc.spent_cents,
                                    "budget_cents": exc.budget_cents}) from exc
    if action is not None:
        pauses.actions().begin(recorder, ctx.run.pk, action)
    try:
        result = tool.impl(ctx, args)
    except (LeaseLost, LimitReached):
        raise  # an action stays executing: the next run finds its outcome unknown
    except Exception as exc:  # noqa: BLE001 - any failure of a tool is reported to the caller, with its reason
        message = str(exc) or type(exc).__name__
        if action is not None:
            pauses.actions().fail(recorder, action, {"ok": False, "error": message[:pauses.RECEIPT_EXCERPT]}, message)
        recorder.event(EventKind.TOOL_RESULT, f"{name} failed: {message}", {"tool": name, "ok": False, "error": message})
        raise ToolFailed(f"tool '{name}' failed: {message}", field="tool") from exc
    if action is not None:
        pauses.actions().succeed(recorder, action, {"ok": True, "digest": pauses.receipt_digest(result),
                                                    "result": bounded(result, chars=pauses.RECEIPT_EXCERPT)})
    recorder.event(EventKind.TOOL_RESULT, f"{name} ok", {"tool": name, "ok": True, "result": result,
                                                          **({"action": action.pk} if action else {})})
    return result

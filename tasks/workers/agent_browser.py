"""The agent's browser tools: open a page, act on it, read it, take a screenshot.

Each call becomes one flow browser step, checked as a flow's step is (``validate_flow``) and run
by the flow's own code in one browser for the agent's run: the same origin hold, payment guard,
dialog answers, secrets typed from ``${name}`` and masked in evidence, before/after screenshots.
Offered when the box has a browser and the task lists hosts to reach.
"""
from __future__ import annotations

from typing import Any

from boxsite.core.errors import InvalidFlow
from tasks.browser.binary import missing_reason
from tasks.run.context import RunContext
from tasks.spec.flows import validate_flow

_TARGET = {
    "description": "the element: a CSS selector string, or an object with one of selector, text, role (with name), "
                   "label, placeholder or describe (plain words), and frame (the selector of an iframe) when it is inside one",
    "anyOf": [{"type": "string"}, {"type": "object"}],
}
ACTIONS = ("click", "fill", "press", "select", "upload", "pick", "wait", "tab")
FUNCTIONS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "browser_open", "description": "Open a page in the task's browser (only the hosts the task lists).",
        "parameters": {"type": "object", "additionalProperties": False, "properties": {"url": {"type": "string"}},
                       "required": ["url"]}}},
    {"type": "function", "function": {
        "name": "browser_act",
        "description": "Act on the open page: click, fill (value), press (keys, e.g. \"Enter\"), select (option), "
                       "upload (file: a path in the task's files), pick (by: first|last|cheapest|highest), wait (for "
                       "the target to appear; or target \"network\"), tab (target: first|last|previous). A payment is "
                       "never made without the owner. dialog: how to answer a dialog the action opens.",
        "parameters": {"type": "object", "additionalProperties": False, "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)}, "target": _TARGET,
            "value": {"type": "string"}, "keys": {"type": "string"}, "option": {"type": "string"}, "file": {"type": "string"},
            "by": {"type": "string"}, "dialog": {"type": "string", "enum": ["accept", "dismiss"]},
            "timeout_s": {"type": "number", "exclusiveMinimum": 0}},
            "required": ["action"]}}},
    {"type": "function", "function": {
        "name": "browser_extract",
        "description": "Read the open page: its text (no arguments), the elements a target names, or, with describe "
                       "(plain words) and an optional JSON schema, what the model reads from it.",
        "parameters": {"type": "object", "additionalProperties": False, "properties": {
            "target": _TARGET, "describe": {"type": "string"}, "schema": {"type": "object"}}}}},
    {"type": "function", "function": {
        "name": "browser_screenshot", "description": "Save a screenshot of the open page for the owner (secret fields blank).",
        "parameters": {"type": "object", "additionalProperties": False, "properties": {"full_page": {"type": "boolean"}}}}},
]
NAMES = frozenset(f["function"]["name"] for f in FUNCTIONS)


def functions(ctx: RunContext) -> list[dict[str, Any]]:
    """The browser tools, when this task can have a browser."""
    if not ctx.task.hosts or missing_reason() is not None:
        return []
    return FUNCTIONS


def as_step(name: str, args: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The flow step a browser tool call stands for, and its kind; or None and what is wrong."""
    step: dict[str, Any]
    if name == "browser_open":
        step = {"browse": args["url"]}
    elif name == "browser_screenshot":
        step = {"screenshot": {"full_page": bool(args.get("full_page"))}}
    elif name == "browser_extract":
        if "describe" in args:
            step = {"extract": {"describe": args["describe"], **({"schema": args["schema"]} if "schema" in args else {})}}
        elif "target" in args:
            step = {"extract": _target(args["target"])}
        else:
            step = {"extract": "body"}
    else:
        action = args["action"]
        target = args.get("target")
        extra = {k: args[k] for k in ("value", "keys", "option", "file", "by") if k in args}
        if action == "tab" or (action == "wait" and target in ("network", "load")) or (action == "press" and target is None):
            value: Any = target if action != "press" else extra.get("keys", "")
        else:
            value = {**(_target(target) if target is not None else {}), **extra}
        step = {action: value}
        if "dialog" in args:
            step["dialog"] = args["dialog"]
        if "timeout_s" in args:
            step["timeout_s"] = args["timeout_s"]
    kind = next(iter(step))
    try:
        validate_flow({"steps": [step]})
    except InvalidFlow as exc:
        return None, str(exc.message).replace("flow.steps[0]: ", "").replace("flow.steps[0]", kind)
    return step, kind


def _target(target: Any) -> dict[str, Any]:
    return {"selector": target} if isinstance(target, str) else dict(target)

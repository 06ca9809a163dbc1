"""Guards a model cannot take off: which steps stop for the owner's OK whatever the model wrote.

A flow the planner writes, and a step the rescuer amends, come from the model; the model may
leave out ``stop_before``. Here the box decides instead, from what a step does: a step that
deletes (a ``delete`` step, ``rm``, SQL ``DELETE``/``DROP``), sends (an HTTP request other than
GET/HEAD, mail, a push), pays, or calls a tool that acts irreversibly carries ``stop_before``.
An amended step keeps the guard of the step it replaces, and when that step had been approved,
the amended one needs an approval of its own (an OK covers the action it was given for).
"""
from __future__ import annotations

import re
from typing import Any

from tasks.spec.flows import STEP_KINDS, step_kind
from tasks.tools.http import host_allowed
from tasks.tools.registry import get_tool

SAFE_METHODS = frozenset({"GET", "HEAD"})

# Words of a shell command that delete, send or pay. A command matched by mistake only costs a
# question to the owner; one missed would act unasked, so the patterns lean wide.
_DELETES = re.compile(r"(^|[\s;&|(`]|\$\()(rm|rmdir|unlink|shred|truncate|wipefs|mkfs(\.\w+)?)(\s|$)"
                      r"|\bfind\b.*\s-delete\b|\bDELETE\s+FROM\b|\bDROP\s+(TABLE|DATABASE|SCHEMA)\b|\bTRUNCATE\s+TABLE\b",
                      re.IGNORECASE)
_SENDS = re.compile(r"\bcurl\b.*(\s-X\s*|\s--request\s+)(POST|PUT|PATCH|DELETE)\b"
                    r"|\bcurl\b.*\s(-d|--data[\w-]*|-F|--form|-T|--upload-file|--json)\b"
                    r"|\bwget\b.*\s--(post|method|body)[\w-]*"
                    r"|\b(sendmail|mailx?|mutt|msmtp|swaks)\b|\bgit\s+push\b|\b(scp|rsync|sftp)\b"
                    r"|\bhttp(ie)?\s+(POST|PUT|PATCH|DELETE)\b", re.IGNORECASE)
_TOOL_WORDS = re.compile(r"(^|[._-])(send|mail|email|notify|post|publish|pay|payment|checkout|purchase|order|delete|"
                         r"remove|drop|transfer|refund)", re.IGNORECASE)
# notify.owner writes to the task's own log: nothing leaves the box.
_HARMLESS_TOOLS = frozenset({"notify.owner"})


# The agent's commands that clearly write over the network: curl or wget with a method other than
# GET/HEAD, or with data to send. Narrow on purpose (the agent runs many commands; each match is a
# question to the owner): within one command of a pipeline, these tools and flags only.
_ONE = r"[^;&|\n]*?"
_NETWORK_WRITES = re.compile(
    rf"\bcurl\b{_ONE}(\s-X\s*|\s--request[=\s]\s*)['\"]?(?!(GET|HEAD)\b)[A-Za-z]+"
    rf"|\bcurl\b{_ONE}\s(-d|--data[\w-]*|-F|--form[\w-]*|-T|--upload-file|--json)(?=[\s='\"@]|$)"
    rf"|\bwget\b{_ONE}\s--(post-data|post-file|body-data|body-file)\b"
    rf"|\bwget\b{_ONE}\s--method[=\s]\s*['\"]?(?!(GET|HEAD)\b)[A-Za-z]+", re.IGNORECASE)
_URL_HOST = re.compile(r"\bhttps?://(\[[^\]]+\]|[^/\s:'\"?#]+)", re.IGNORECASE)


def command_writes(command: str, hosts: list[str]) -> bool:
    """True when the agent's ``command`` sends something out with curl or wget (a method other
    than GET/HEAD, or data) and may reach a listed host: it names one, or names no URL the box
    can read. A command whose every URL is unlisted is refused by the network anyway."""
    if not hosts or not _NETWORK_WRITES.search(command):
        return False
    named = [m.group(1).strip("[]") for m in _URL_HOST.finditer(command)]
    return not named or any(host_allowed(host, hosts) for host in named)


def sends(method: Any) -> bool:
    """True for an HTTP method that changes something on the other side."""
    return str(method or "GET").upper() not in SAFE_METHODS


def why_guarded(step: dict[str, Any]) -> str | None:
    """Why ``step`` must wait for the owner's OK whatever its author wrote; None when it need not."""
    kind = step_kind(step)
    value = step[kind]
    if kind == "delete":
        return "the step deletes a file"
    if kind == "run":
        command = value if isinstance(value, str) else str(value.get("cmd", ""))
        if _DELETES.search(command):
            return "the step's command deletes"
        if _SENDS.search(command):
            return "the step's command sends something out"
        return None
    if kind == "http":
        method = "GET" if isinstance(value, str) else value.get("method", "GET")
        return f"the step sends an HTTP {str(method).upper()}" if sends(method) else None
    if kind == "tool":
        name = str(value)
        args = step.get("args") if isinstance(step.get("args"), dict) else {}
        tool = get_tool(name)
        if tool is not None and tool.acts_irreversibly(args or {}):
            return f"the step calls {name}, which acts irreversibly"
        if name not in _HARMLESS_TOOLS and _TOOL_WORDS.search(name):
            return f"the step calls {name}, which may send, pay or delete"
        return None
    return None


def guard_planned(step: dict[str, Any]) -> dict[str, Any]:
    """``step`` as the box runs it: with ``stop_before`` when it deletes, sends, pays or acts
    irreversibly (the model's own reason is kept when it wrote one)."""
    if "stop_before" in step or not STEP_KINDS[step_kind(step)].acts:
        return step
    why = why_guarded(step)
    return {**step, "stop_before": f"{why}: approve to go on"} if why else step


def keep_guard(failed: dict[str, Any], amended: dict[str, Any], *, approved: bool) -> dict[str, Any]:
    """The rescuer's ``amended`` step with the guard of the ``failed`` step it replaces.
    ``approved``: the failed step ran on an OK (a ``stop_before``, an ``approve`` gate in front
    of it); that OK was for the failed step, so the amended one asks again."""
    amended = guard_planned(amended)
    if "stop_before" in amended or not STEP_KINDS[step_kind(amended)].acts:
        return amended
    if "stop_before" in failed:
        return {**amended, "stop_before": f"amended by the rescuer in place of a guarded step ({failed['stop_before']})"}
    if approved:
        return {**amended, "stop_before": "amended by the rescuer in place of an approved step"}
    return amended

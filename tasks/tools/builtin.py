"""Built-in tools (``http.request``, ``notify.owner``) and owner-declared command tools.

A command tool is an entry in the JSON list named by ``BOX_TOOLS_FILE``::

    {"name": "shop.order", "command": ["/opt/tools/order"], "description": "...",
     "schema": {...JSON Schema...}, "cost_cents": 25, "irreversible": true,
     "keys": ["SHOP_API_KEY"], "timeout_s": 60}

It runs as the box (outside the task's sandbox: that is what makes it a tool with powers the
task lacks), with the arguments as JSON on stdin and a small environment: PATH, LANG, the task's
id and working directory, and the vault keys it declares. Its stdout (JSON, or text) is the
result; a non-zero exit is a failed call with its last stderr line.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from tasks import notify
from tasks.tools.types import NAME_RE, Tool
from tasks.vault.store import read_secret

MAX_RESULT = 256 * 1024


def _http_request(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = ctx.http(args.get("method", "GET"), args["url"], headers=args.get("headers") or {},
                                      body=args.get("body"))
    return result


def _notify_owner(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Send the message to the owner's notification URLs now (redacted like the log) and say
    where it went; with none set it stays in the task's log only, and says so."""
    message = str(args["message"])
    delivery = notify.deliver_for_task(ctx.task, f"Task “{ctx.task.title}”: a message for you",
                                       message,
                                       redactor=ctx.recorder.redactor, note_failure=False)
    result = notify.describe(delivery)
    if not delivery.sent and not delivery.failed:
        result["why"] = ("no notification URL is set (BOX_NOTIFY_URLS or Settings → Notifications) and no phone "
                         "gets Web Push: it is in the log only")
    ctx.note(f"message for the owner: {message}", {"message": message, "notify": result})
    return result


BUILTIN_TOOLS = (
    Tool(
    name="http.request",
    description="An HTTP request to a host the task lists (its network policy applies).",
    schema={
        "type": "object",
        "properties": {
            "url": {"type": "string"},
            "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {},
        },
        "required": ["url"],
        "additionalProperties": False,
    },
    impl=_http_request,
    irreversible_when=lambda args: str(args.get("method") or "GET").upper() not in ("GET", "HEAD"),
    ),
    Tool(
    name="notify.owner",
    description="Send the owner a message (their notification URLs, and the task's log); says where it went.",
    schema={"type": "object", "properties": {"message": {"type": "string", "minLength": 1}}, "required": ["message"],
            "additionalProperties": False},
    impl=_notify_owner,
    ),
)


def _entry_error(name: str, problem: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"BOX_TOOLS_FILE: tool {name!r}: {problem}")


def command_tool(entry: Any) -> Tool:
    """An owner-declared tool that runs a command with the arguments as JSON on stdin."""
    if not isinstance(entry, dict):
        raise ImproperlyConfigured("BOX_TOOLS_FILE: each tool is a JSON object")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ImproperlyConfigured(f"BOX_TOOLS_FILE: tool name {name!r} must look like 'group.name' (lowercase)")
    argv = entry.get("command")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise _entry_error(name, "'command' must be a non-empty list of strings")
    schema = entry.get("schema", {"type": "object"})
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise _entry_error(name, f"'schema' is not a valid JSON Schema: {exc.message}") from exc
    cost = entry.get("cost_cents", 0)
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 0:
        raise _entry_error(name, "'cost_cents' must be a whole number of cents, 0 or more")
    if not isinstance(entry.get("irreversible", False), bool):
        raise _entry_error(name, "'irreversible' must be true or false")
    keys = entry.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise _entry_error(name, "'keys' must be a list of vault key names")
    timeout_s = entry.get("timeout_s", 60)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise _entry_error(name, "'timeout_s' must be a positive number of seconds")

    def impl(ctx: Any, args: dict[str, Any]) -> Any:
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "BOX_TASK_ID": str(ctx.task.pk),
            "BOX_TASK_WORKDIR": str(ctx.workdir),
            "BOX_TOOL": name,
        }
        for key in keys:
            value = read_secret(key)
            if value is None:
                raise RuntimeError(f"the vault has no {key}, which tool {name} needs")
            env[key] = value
        if keys:  # what the tool prints or fails with must not show its keys in clear
            ctx.refresh_redactor()
        timeout = float(timeout_s)
        left = ctx.time_left()
        if left is not None:
            timeout = max(0.1, min(timeout, left))
        # A scratch directory, not the task's files: the tool runs with the box's rights.
        with tempfile.TemporaryDirectory(prefix="box-tool-") as scratch:
            env["HOME"] = scratch
            try:
                proc = subprocess.run(argv, input=json.dumps(args), capture_output=True, text=True, timeout=timeout,
                                      cwd=scratch, env=env, start_new_session=True)
            except subprocess.TimeoutExpired as exc:
                raise RuntimeError(f"timed out after {timeout:g}s") from exc
            except OSError as exc:
                raise RuntimeError(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [""])[-1]
            raise RuntimeError(f"exited with {proc.returncode}" + (f": {last}" if last else ""))
        out = proc.stdout[:MAX_RESULT]
        try:
            return json.loads(out)
        except ValueError:
            return out.strip()

    return Tool(
        name=name,
        description=str(entry.get("description", "")),
        schema=schema,
        impl=impl,
        cost_cents=cost,
        irreversible=entry.get("irreversible", False),
        provider="owner",
        extra={"keys": list(keys)},
    )

"""Built-in tools: ``http.request`` (under the task's network policy) and ``notify.owner``."""
from __future__ import annotations

import subprocess
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from tasks.tools import Tool, register


def _http_request(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.http(args.get("method", "GET"), args["url"], headers=args.get("headers") or {}, body=args.get("body"))


def _notify_owner(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    ctx.note(f"message for the owner: {args['message']}", {"message": args["message"]})
    return {"delivered": True}


register(Tool(
    name="http.request",
    description="An HTTP request to a host the task lists.",
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
))
register(Tool(
    name="notify.owner",
    description="Leave a message for the owner in the task's log.",
    schema={"type": "object", "properties": {"message": {"type": "string", "minLength": 1}}, "required": ["message"], "additionalProperties": False},
    impl=_notify_owner,
))


def command_tool(entry: dict[str, Any]) -> Tool:
    """An owner-declared tool that runs a command with the arguments as JSON on stdin."""
    try:
        name, argv = entry["name"], entry["command"]
    except KeyError as exc:
        raise ImproperlyConfigured(f"a tool in BOX_TOOLS_FILE lacks {exc}") from exc
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ImproperlyConfigured(f"tool {name!r}: 'command' must be a list of strings")

    def impl(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        import json

        proc = subprocess.run(argv, input=json.dumps(args), capture_output=True, text=True, timeout=entry.get("timeout_s", 60), cwd=ctx.workdir)
        if proc.returncode != 0:
            raise RuntimeError(f"tool {name} exited with {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}")
        try:
            return {"result": json.loads(proc.stdout)}
        except ValueError:
            return {"result": proc.stdout}

    return Tool(
        name=name,
        description=entry.get("description", ""),
        schema=entry.get("schema", {"type": "object"}),
        impl=impl,
        cost_cents=int(entry.get("cost_cents", 0)),
        irreversible=bool(entry.get("irreversible", False)),
    )

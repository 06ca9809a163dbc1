"""The tool registry: apps declare tools; tasks may call only the ones they list.

A tool is a name, a JSON Schema for its arguments, a cost per call in cents, whether a call
acts irreversibly (and so needs the owner's OK unless the task allows destructive steps), and an
implementation ``impl(ctx, args) -> dict``. Owners add command-backed tools in a JSON file named
by ``BOX_TOOLS_FILE``.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]
    impl: Callable[[Any, dict[str, Any]], dict[str, Any]]
    cost_cents: int = 0
    irreversible: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, Tool] = {}
_loaded_file = False


def register(tool: Tool) -> Tool:
    _REGISTRY[tool.name] = tool
    return tool


def _load_owner_tools() -> None:
    global _loaded_file
    if _loaded_file:
        return
    _loaded_file = True
    path = getattr(settings, "BOX_TOOLS_FILE", None)
    if not path:
        return
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"BOX_TOOLS_FILE {path!r} cannot be read: {exc}") from exc
    from tasks.toolimpls import command_tool

    for entry in entries:
        register(command_tool(entry))


def get_tool(name: str) -> Tool | None:
    _ensure_builtins()
    _load_owner_tools()
    return _REGISTRY.get(name)


def all_tools() -> list[Tool]:
    _ensure_builtins()
    _load_owner_tools()
    return sorted(_REGISTRY.values(), key=lambda t: t.name)


def _ensure_builtins() -> None:
    # Importing the module registers the built-in tools exactly once.
    import tasks.toolimpls  # noqa: F401

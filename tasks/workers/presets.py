"""Command presets: named external agents (``droid``, ``claude``, ``codex``) and owner-defined ones.

A preset is an argv template (``{prompt}`` is replaced by the task's prompt), the vault keys it
needs, handed to the process as environment variables of the same name, and the hosts its API is
on: a task whose hosts do not cover them asks the owner once before its first start, and the
hosts the owner allows join the task's (``tasks.workers.command``).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Preset:
    name: str
    argv: tuple[str, ...]
    keys: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()


BUILTIN_PRESETS = {
    p.name: p
    for p in (
        Preset("droid", ("droid", "exec", "--auto", "high", "{prompt}"), ("FACTORY_API_KEY",), ("api.factory.ai",)),
        Preset("claude", ("claude", "-p", "{prompt}", "--dangerously-skip-permissions"), ("ANTHROPIC_API_KEY",),
               ("api.anthropic.com",)),
        Preset("codex", ("codex", "exec", "--full-auto", "{prompt}"), ("OPENAI_API_KEY",), ("api.openai.com",)),
    )
}


# How to install each built-in agent's real CLI, as its makers document it (docs/guide/agents.md).
INSTALL = {
    "droid": "npm install -g droid",
    "claude": "npm install -g @anthropic-ai/claude-code",
    "codex": "npm install -g @openai/codex",
}


def installed_presets() -> list[dict[str, object]]:
    """Each preset, whether its program is on the box's PATH, where, and how to install it."""
    out: list[dict[str, object]] = []
    for preset in all_presets().values():
        where = shutil.which(preset.argv[0])
        out.append({"name": preset.name, "program": preset.argv[0], "installed": where is not None, "path": where or "",
                    "keys": list(preset.keys), "hosts": list(preset.hosts), "install": INSTALL.get(preset.name, "")})
    return out


def all_presets() -> dict[str, Preset]:
    presets = dict(BUILTIN_PRESETS)
    path = getattr(settings, "BOX_PRESETS_FILE", None)
    if path:
        try:
            entries = json.loads(Path(path).read_text())
            for entry in entries:
                hosts = entry.get("hosts", [])
                if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
                    raise ValueError(f"preset {entry['name']!r}: hosts must be a list of host names")
                presets[entry["name"]] = Preset(entry["name"], tuple(entry["argv"]), tuple(entry.get("keys", ())),
                                                tuple(h.lower() for h in hosts))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImproperlyConfigured(f"BOX_PRESETS_FILE {path!r} is not a valid list of presets: {exc}") from exc
    return presets

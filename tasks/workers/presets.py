"""Command presets: named external agents (``droid``, ``claude``, ``codex``) and owner-defined ones.

A preset is an argv template (``{prompt}`` is replaced by the task's prompt) and the vault keys
it needs, handed to the process as environment variables of the same name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Preset:
    name: str
    argv: tuple[str, ...]
    keys: tuple[str, ...] = ()


BUILTIN_PRESETS = {
    p.name: p
    for p in (
        Preset("droid", ("droid", "exec", "--auto", "high", "{prompt}"), ("FACTORY_API_KEY",)),
        Preset("claude", ("claude", "-p", "{prompt}", "--dangerously-skip-permissions"), ("ANTHROPIC_API_KEY",)),
        Preset("codex", ("codex", "exec", "--full-auto", "{prompt}"), ("OPENAI_API_KEY",)),
    )
}


def all_presets() -> dict[str, Preset]:
    presets = dict(BUILTIN_PRESETS)
    path = getattr(settings, "BOX_PRESETS_FILE", None)
    if path:
        try:
            entries = json.loads(Path(path).read_text())
            for entry in entries:
                presets[entry["name"]] = Preset(entry["name"], tuple(entry["argv"]), tuple(entry.get("keys", ())))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImproperlyConfigured(f"BOX_PRESETS_FILE {path!r} is not a valid list of presets: {exc}") from exc
    return presets

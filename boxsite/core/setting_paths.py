"""Directory settings as paths, parsed once per value."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings

_parsed: dict[str, tuple[object, Path]] = {}


def path_setting(name: str) -> Path:
    """``settings.<name>`` as a Path, parsed again only when the setting changes (tests override
    it): a task's start, seal and release name paths under the data directory many times."""
    raw = getattr(settings, name)
    cached = _parsed.get(name)
    if cached is not None and cached[0] == raw:
        return cached[1]
    path = Path(raw)
    _parsed[name] = (raw, path)
    return path

"""Which Chromium the box runs for a task's browser steps, and whether it is there."""
from __future__ import annotations

import os

from django.conf import settings

# Debian's /usr/bin/chromium is a shell wrapper that reads /etc/chromium.d (not in a task's
# root); the binary it runs is started directly.
_DEBIAN_BINARY = "/usr/lib/chromium/chromium"
DEBIAN_WRAPPER = "/usr/bin/chromium"


def executable() -> str:
    """The one Chromium the box runs (``constraints.browser_executable`` may only name it)."""
    configured = str(settings.BOX_BROWSER_EXECUTABLE)
    if configured == DEBIAN_WRAPPER and os.path.isfile(_DEBIAN_BINARY):
        return _DEBIAN_BINARY
    return configured


def missing_reason() -> str | None:
    """Why this box cannot run browser steps, or None."""
    path = executable()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return f"no browser at {path} (install Debian's chromium package)"
    return None

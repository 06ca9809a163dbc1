"""What isolation this box can give a task, said plainly (never pretended)."""
from __future__ import annotations

import os
from typing import Any


def is_root() -> bool:
    return os.geteuid() == 0


def describe_isolation() -> dict[str, Any]:
    return {
        "sandbox": False,
        "layers": "copy",
        "network": "host allowlist checked for requests the box makes; processes are not confined",
        "summary": "no sandbox yet: task processes run as the box's user in their own session",
    }

"""A task's default limits: low in the import graph, so the model can read them."""
from __future__ import annotations

from django.conf import settings

DEFAULT_LIMITS: dict[str, int | None] = {
    "max_actions": 120,
    "max_model_calls": 6000,
    "max_rescues": 5,
    "max_elapsed_ms": None,
    "memory_mb": None,  # defaults from settings (RESOURCE_DEFAULTS)
    "cpu_percent": None,
    "disk_mb": None,
}
# Resource limits whose default is a setting (env), read when asked so a changed setting counts.
RESOURCE_DEFAULTS = {"memory_mb": "BOX_TASK_MEMORY_MB", "cpu_percent": "BOX_TASK_CPU_PERCENT",
                     "disk_mb": "BOX_TASK_DISK_MB"}


def default_limit(name: str) -> int | None:
    """The limit a task gets when its spec does not set ``name``."""
    if name in RESOURCE_DEFAULTS:
        return int(getattr(settings, RESOURCE_DEFAULTS[name])) or None  # 0: no default (disk_mb)
    return DEFAULT_LIMITS.get(name)

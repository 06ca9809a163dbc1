"""The sandbox (DESIGN §12): a user, PID and network namespace per task. Placeholder until the
sandbox work lands."""
from __future__ import annotations


def release(task_id: str) -> None:
    """After the task ended: stop its processes, close its broker, remove its user (idempotent)."""

"""django-q2 entry points. Thin and idempotent; they take ids."""
from __future__ import annotations

from tasks.machines import moves
from tasks.run import worker


def execute_run(run_id: int) -> None:
    """Claim run ``run_id``, execute it, and go on along its chain (``tasks.run.worker``). A second
    delivery finds it claimed and returns. Queued jobs name this function: its dotted name stays."""
    worker.execute_run(run_id)


def move_workspace(workspace_id: int) -> None:
    """On the machine a workspace moves to: copy it here and home it here
    (``tasks.machines.moves``). A move that cannot finish yet is sent again by the scheduler."""
    moves.receive(workspace_id)

"""Task states, pause kinds, review states, and the tables of allowed moves.

Nothing outside ``tasks.services`` writes ``Task.state`` or ``Task.review``: both change only
through its one conditional write (``_write_task``), which checks these tables.
"""
from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNDONE = "undone"


class WaitingFor(models.TextChoices):
    INPUT = "input"
    APPROVAL = "approval"
    CHECKPOINT = "checkpoint"
    HUMAN = "human"
    PLAN = "plan"


class Review(models.TextChoices):
    """Where a finished folder task stands with its owner: Keep or Undo."""

    PENDING = "pending"
    KEPT = "kept"
    CONFLICT = "conflict"
    UNDONE = "undone"


ALLOWED: dict[str, frozenset[str]] = {
    State.QUEUED: frozenset({State.RUNNING, State.FAILED, State.CANCELLED, State.UNDONE}),
    State.RUNNING: frozenset({State.WAITING, State.DONE, State.FAILED, State.CANCELLED, State.UNDONE}),
    State.WAITING: frozenset({State.RUNNING, State.DONE, State.FAILED, State.CANCELLED, State.UNDONE}),
    State.DONE: frozenset({State.UNDONE}),
    # A recoverable failure can be retried in place (``tasks.verbs.retry_task``): back to the
    # queue, its layer reopened, resuming from the step that failed.
    State.FAILED: frozenset({State.QUEUED, State.UNDONE}),
    State.CANCELLED: frozenset({State.UNDONE}),
    State.UNDONE: frozenset(),
}

# A folder task's review: "" until it ends. Done, it waits for the owner (pending); Keep applies
# it (kept) or finds the owner changed the same paths (conflict, and Keep may be tried again);
# Undo discards it (undone). Kept changes are in the owner's folder: the box never takes them back.
REVIEW_MOVES: dict[str, frozenset[str]] = {
    "": frozenset({Review.PENDING, Review.UNDONE}),
    Review.PENDING: frozenset({Review.KEPT, Review.CONFLICT, Review.UNDONE}),
    Review.CONFLICT: frozenset({Review.KEPT, Review.CONFLICT, Review.UNDONE}),
    Review.KEPT: frozenset(),
    Review.UNDONE: frozenset(),
}

FINAL = frozenset({State.DONE, State.FAILED, State.CANCELLED, State.UNDONE})
ACTIVE = frozenset({State.QUEUED, State.RUNNING, State.WAITING})


def can_move(old: str, new: str) -> bool:
    return new in ALLOWED.get(old, frozenset())


def can_move_review(old: str, new: str) -> bool:
    return new in REVIEW_MOVES.get(old, frozenset())


def is_final(state: str) -> bool:
    return state in FINAL

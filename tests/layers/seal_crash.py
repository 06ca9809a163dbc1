"""A release of an ended copy-driver task that dies (SIGKILL, as a killed worker or a power cut
would end it) at one point of its layer's seal: ``kill_release_at`` runs in a box process of its
own (``manage.py shell``) on the test database. It exits 3 if the point was never reached."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from tasks.layers import copy, task_view
from tasks.run import lifecycle

POINTS = (
    "before the first move",  # the scan journaled, nothing moved yet
    "after two moves",  # some changed files in the layer, the rest still in the working copy
    "inside a move",  # out of a disk image: the link copied to the layer, its source not yet removed
    "after the moves",  # every change in the layer, the working copy not yet thrown away
    "after the working copy is gone",  # the deletions were known in memory only, the meta not saved
)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_release_at(task_id: str, point: str) -> None:
    moved = 0
    move, copy_entry, discard, summarise = copy._move, copy.copy_entry, copy.discard, task_view.summarise

    def moving(source: Path, target: Path) -> None:
        nonlocal moved
        if point == "before the first move":
            die()
        move(source, target)
        moved += 1
        if point == "after two moves" and moved == 2:
            die()

    def copying(source: Path, target: Path) -> None:
        copy_entry(source, target)
        if point == "inside a move" and source.is_symlink():
            die()

    def discarding(directory: Path) -> None:
        if point == "after the moves":
            die()
        discard(directory)

    def summarising(*args: Any, **kwargs: Any) -> Any:
        if point == "after the working copy is gone":
            die()
        return summarise(*args, **kwargs)

    copy._move, copy.copy_entry, copy.discard = moving, copying, discarding  # type: ignore[assignment]
    task_view.summarise = summarising  # type: ignore[assignment]
    lifecycle.release(task_id)
    sys.exit(3)

"""Cross-process locks (flock). Layers are shared by the web process, every worker process and
the scheduler on one machine; these locks order the few operations that must not interleave."""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from tasks.layers import paths


@contextmanager
def _flock(*parts: str) -> Iterator[None]:
    try:
        fd = os.open(paths.lock_path(*parts), os.O_RDWR | os.O_CREAT, 0o600)
    except FileNotFoundError:  # the first lock of its kind: make its directory
        fd = os.open(paths.lock_file(*parts), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def workspace_lock(workspace_id: int) -> Iterator[None]:
    """Held while a task records its stack and while layers and flats are swept, so a layer or
    flat is never deleted between a task choosing it and recording that it reads it. Flats are
    built and found without it (``compaction.ensure_flat``)."""
    with _flock(f"workspace-{workspace_id}"):
        yield


@contextmanager
def layer_lock(task_id: str) -> Iterator[None]:
    """Held while one task's layer is mounted, sealed, kept or deleted. Never hold two at once."""
    with _flock("layers", task_id):
        yield


def drop_layer_lock(task_id: str) -> None:
    """Forget a deleted layer's lock file (a late waiter locks the unlinked file, finds no layer)."""
    try:
        paths.lock_file("layers", task_id).unlink()
    except FileNotFoundError:
        pass

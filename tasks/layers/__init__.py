"""Workspaces and layers (docs/internals/layers.md#layers).

Every task works on its own copy-on-write layer over its workspace's stack (the base plus the
layers of done tasks, newest first). The hooks the rest of the box calls:

- ``open_view(task)``: at the start of every run; idempotent (a retry gets the same view).
- ``on_final_move(task, state)``: inside the transaction that ends a task or undoes it.
- ``on_retry(task)``: inside the transaction that sends a failed task back to the queue.
- ``release(task_id)``: after commit of every final move, and at start-up; always unmounts.
- ``reconcile()``: at start-up, unmounts whatever a crash left mounted under the data dir.
- ``write_due_notes()``: at start-up after the releases, and hourly: override notes a crash left unwritten.
"""
from __future__ import annotations

import logging
import shutil

from tasks.layers import disk, mounts, paths, sealer
from tasks.layers.task_view import on_final_move, on_retry, open_view, release, rows_of, write_due_notes
from tasks.models import Task
from tasks.states import ACTIVE

log = logging.getLogger(__name__)

__all__ = ["on_final_move", "on_retry", "open_view", "reconcile", "release", "rows_of", "sealer", "unmount_views", "write_due_notes"]


def reconcile() -> None:
    """Unmount every view (and lower mount) under the data dir whose task is not active, and
    release that task."""

    task_ids: set[str] = set()
    for root in (paths.views_root(), paths.lower_mounts_root(), paths.data_dir() / "layers"):
        task_ids |= {point.relative_to(root).parts[0] for point in mounts.mounts_under(root)
                     if point != root and not point.relative_to(root).parts[0].startswith(".")}  # not a probe
    disk.sweep()  # images of settled layers still mounted, and images set aside for deletion
    shutil.rmtree(paths.trash_dir(), ignore_errors=True)  # deletions a stopped process left half done
    active = set(Task.objects.filter(pk__in=task_ids, state__in=ACTIVE).values_list("pk", flat=True))
    for task_id in sorted(task_ids - active):
        log.info("unmounting the view task %s left behind", task_id)
        release(task_id)


def unmount_views(task_ids: list[str]) -> None:
    """Unmount these tasks' views whatever their state: for test teardown, where a task may be
    left waiting when its rows are flushed (``reconcile`` would find it only at the next start)."""
    for task_id in task_ids:
        for root in paths.mount_roots(task_id):
            mounts.unmount_all_under(root)
        disk.unmount(task_id)  # its image stays: the task's next run mounts it again

"""A done task's layer sealed beside its finish, not on the next task's path.

When a worker's run ends with its work done (``Done``, no completion criteria, no folders), its
layer joins the workspace as soon as the finish commits, and a task chained after it stacks it at
once: that task's start must find it sealed, or seal it first (its processes stopped, its view
unmounted, its changes put in the layer format, its manifest and row written), a large part of
a chain's link. The worker hands the seal to this process's **sealer** thread instead, which
seals the files while the finish's transaction runs (mostly waiting for the database) and writes
the rows once it has committed; a start that stacks the layer meanwhile waits for the layer's
lock, as it waits for any seal.

Sealing before the task is final is safe because nothing else can write the layer: the worker's
run has done its work and holds the lease, which nobody takes over before it expires (checked
first: at least half of it must be left), and every other seal or opening of the layer takes its
lock. If the finish does not end the task (its lease was lost, or a database fault handed the run
back), the layer is left sealed on disk only: the task's next run reopens it, as a retried
task's (``task_view._reopen``). A seal that fails, or does not happen, is done by the
dependent's start or the task's release, as any seal not made here. Overlay layers only: the
copy driver's seal moves the working copy's changes out under a journal of its own, which is
not split in two here.
"""
from __future__ import annotations

import threading

from django.conf import settings

from boxsite.core.background import Background
from tasks.layers import paths, task_view
from tasks.layers.locks import layer_lock
from tasks.layers.tree import Meta
from tasks.run import leases as runs
from tasks.states import ACTIVE

_sealer = Background("box-sealer")


def seal_beside(task_id: str, run_id: int, token: str) -> threading.Event:
    """Begin sealing ``task_id``'s layer while run ``run_id`` (which holds the lease as ``token``
    and has done its work) is finished. Set the event returned once the finish is over, whether
    it committed or not."""
    over = threading.Event()
    _sealer.submit(lambda: _seal(task_id, run_id, token, over))
    return over


def drain(timeout: float = 30.0) -> bool:
    """Wait until the seals this process began are done (``boxsite.core.background``)."""
    return _sealer.drain(timeout)


def _seal(task_id: str, run_id: int, token: str, over: threading.Event) -> None:
    directory = paths.layer_dir(task_id)
    with layer_lock(task_id):
        meta = Meta.load(directory)
        if meta.sealed or not runs.lease_lasts(run_id, token, settings.BOX_LEASE_SECONDS / 2):
            return  # sealed already, or the finish is over (or the lease nearly gone): left to the start or release
        task, layer = task_view.rows_of(task_id)
        if task is None or layer is None or task.folders or layer.driver != "overlay":
            return
        roots, summary = task_view.seal_files(task, layer, meta)
    # The lock is let go while the finish runs: whatever its commit sets going in this thread
    # (django-q2's synchronous mode runs a dependent's run there) may stack the layer. Whoever
    # takes the lock first seals it; the overlay's seal finds its files sealed and seals them
    # again at no cost.
    over.wait(settings.BOX_LEASE_SECONDS)
    with layer_lock(task_id):
        if Meta.load(directory).sealed:
            return  # by a start that stacked it meanwhile
        fresh_task, fresh_layer = task_view.rows_of(task_id)
        if fresh_task is None or fresh_layer is None:
            return  # undone and deleted meanwhile
        layer.applied_at, task.state = fresh_layer.applied_at, fresh_task.state
        if task.state in ACTIVE:
            meta.save(directory)  # sealed on disk only: the task's next run reopens it
            return
        task_view.record_seal(task, layer, meta, roots, summary)

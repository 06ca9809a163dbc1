"""What a task holds while it runs, set up before its first step and released when it ends.

``prepare`` gives a run its working directory; ``release`` frees everything a task held, in the
order docs/architecture.md#states gives ("When a task ends"). Both are idempotent: ``release``
runs after every final move and again when the box starts, for tasks a crash left behind.
"""
from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

from tasks import layers, sandbox
from tasks.models import Task
from tasks.states import ACTIVE, FINAL

log = logging.getLogger(__name__)


def prepare(task: Task) -> Path:
    sandbox.prepare(task.pk)  # the task's user first: the view is made for it
    return layers.open_view(task)


def release(task_id: str) -> bool:
    """Run every release step, each even when one before it failed. False if any failed: the
    failure is logged with its reason, and start-up reconcile tries again."""
    ok = True
    # processes, broker socket, the task's user; then mounts, and the layer joins, stays apart, or goes
    for name, step in (("sandbox", sandbox.release), ("layers", layers.release)):
        try:
            step(task_id)
        except Exception:  # noqa: BLE001 - the next step must still run; reconcile retries this one
            log.exception("releasing the %s of task %s failed; start-up reconcile will try again", name, task_id)
            ok = False
    return ok


def reconcile() -> None:
    """At start-up: release every ended task whose resources a crash may have left behind."""

    for name, step in (("sandbox", sandbox.reconcile), ("layers", layers.reconcile)):
        # users and runtime dirs of ended or unknown tasks; mounts whose task is no longer active
        try:
            step()
        except Exception:  # noqa: BLE001 - one leftover must not keep the box from starting
            log.exception("reconciling %s leftovers failed; the box starts anyway", name)

    root = Path(settings.BOX_DATA_DIR) / "tasks"
    if not root.is_dir():
        return
    ended = set(Task.objects.filter(state__in=FINAL).values_list("pk", flat=True))
    for entry in root.iterdir():
        if entry.name in ended:
            release(entry.name)


def release_host() -> None:
    """When the box stops, after its processes have: leave nothing on the host. Ended or unknown
    tasks are released (finishing a release the stop cut short); active tasks give up their
    processes, user and mounts, which their next run makes again."""

    for name, step in (("sandbox", sandbox.reconcile), ("layers", layers.reconcile)):
        try:
            step()
        except Exception:  # noqa: BLE001 - release the rest; the next start tries again
            log.exception("releasing %s leftovers at stop failed; the next start tries again", name)
    active = list(Task.objects.filter(state__in=ACTIVE).values_list("pk", flat=True))
    for task_id in active:
        try:
            sandbox.release(task_id)
        except Exception:  # noqa: BLE001 - as above
            log.exception("releasing the sandbox of active task %s at stop failed", task_id)
    layers.unmount_views(active)

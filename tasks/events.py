"""The action log's write path and the one publisher.

``record_event`` is the only code that creates ``TaskEvent`` rows and the only caller of the
redaction function on the write path. ``publish_*`` run after commit and only notify: the
database stays the source of truth, and consumers re-read from it.
"""
from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.db.models import F

from tasks.facts import Redactor, redactor_for
from tasks.models import Task, TaskEvent

log = logging.getLogger(__name__)

MAX_SUMMARY = 2000


def task_group(task_id: str) -> str:
    return f"task.{task_id}"


def owner_group(owner_id: int) -> str:
    return f"tasks.owner.{owner_id}"


def record_event(
    task: Task,
    kind: str,
    summary: str,
    data: dict[str, Any] | None = None,
    *,
    cost_cents: int = 0,
    artifacts: list[Any] | None = None,
    redactor: Redactor | None = None,
) -> TaskEvent:
    """Append one event to ``task``'s log. Call inside the transaction that made the change."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_event must run inside the transaction that made the change")
    redact = redactor or redactor_for(task)
    # The UPDATE takes the task row's lock until commit, so concurrent writers get
    # consecutive numbers and a rolled-back writer leaves no gap.
    Task.objects.filter(pk=task.pk).update(event_seq=F("event_seq") + 1)
    seq = Task.objects.filter(pk=task.pk).values_list("event_seq", flat=True).get()
    event = TaskEvent.objects.create(
        task_id=task.pk,
        seq=seq,
        kind=kind,
        summary=redact.text(summary)[:MAX_SUMMARY],
        data=redact.redact(data or {}),
        cost_cents=cost_cents,
        artifacts=redact.redact(artifacts or []),
    )
    task.event_seq = seq
    owner_id = task.owner_id
    transaction.on_commit(lambda: publish_event(task.pk, owner_id, event.pk, seq, kind))
    return event


def publish_event(task_id: str, owner_id: int, event_id: int, seq: int, kind: str) -> None:
    """Tell live consumers that ``task_id`` has a new event. A no-op without a channel layer
    (embedded mode, where consumers poll the event table)."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "event.new", "task": task_id, "id": event_id, "seq": seq, "kind": kind}
    try:
        async_to_sync(layer.group_send)(task_group(task_id), message)
        async_to_sync(layer.group_send)(owner_group(owner_id), {**message, "type": "task.changed"})
    except Exception:  # noqa: BLE001 - a lost notification is recovered by the client's seq cursor
        log.warning("live notification for %s seq %s failed; clients catch up from the log", task_id, seq, exc_info=True)

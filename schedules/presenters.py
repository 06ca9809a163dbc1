"""How schedules, their firings and triggers look to callers. Secrets never appear here."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from schedules.models import Delivery, Firing, Schedule, Trigger, TriggerKind
from tasks.vault.facts import Facts


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _template(template: dict[str, Any]) -> dict[str, Any]:
    """The template with its secret facts shown as ``${name}``, as task views show them."""
    facts = template.get("facts")
    if not isinstance(facts, dict) or not facts:
        return template
    secret = Facts.build(facts, template.get("secretFacts") or []).secret_names
    return {**template, "facts": {k: "${" + k + "}" if k in secret else v for k, v in facts.items()}}


def present_firing(firing: Firing) -> dict[str, Any]:
    return {
        "occurrence": _iso(firing.occurrence),
        "firedAt": _iso(firing.fired_at),
        "skipped": firing.skipped,
        "skippedAtLeast": firing.skipped_at_least,
        "task": firing.task_id,
        "taskTitle": firing.task.title if firing.task is not None else None,
        "taskState": firing.task.state if firing.task is not None else None,
        "error": firing.error or None,
    }


def present_schedule(schedule: Schedule, *, last_firing: Firing | None = None) -> dict[str, Any]:
    return {
        "id": schedule.pk,
        "name": schedule.name,
        "source": schedule.source,
        "cron": schedule.cron or None,
        "timezone": schedule.timezone if schedule.cron else None,
        "intervalSeconds": schedule.interval_seconds,
        "cadence": schedule.cadence.describe(),
        "template": _template(schedule.template),
        "status": schedule.status(),
        "enabled": schedule.enabled,
        "paused": schedule.paused,
        "disabledReason": schedule.disabled_reason or None,
        "system": schedule.system,
        "origin": schedule.created_via,
        "createdByDevice": schedule.created_by_device_id,
        "createdByTask": schedule.created_by_task_id,
        "createdByRun": schedule.created_by_run,
        "nextRunAt": _iso(schedule.next_run_at),
        "lastRunAt": _iso(schedule.last_run_at),
        "lastTask": schedule.last_task_id,
        "lastFiring": present_firing(last_firing) if last_firing else None,
        "consecutiveFailures": schedule.consecutive_failures,
        "backoffUntil": _iso(schedule.backoff_until),
        "needsAttention": schedule.needs_attention,
        "lastError": schedule.last_error or None,
        "version": schedule.version,
        "createdAt": _iso(schedule.created_at),
        "updatedAt": _iso(schedule.updated_at),
    }


def present_delivery(delivery: Delivery) -> dict[str, Any]:
    # A delivery id is the sender's (X-GitHub-Delivery) or, for a timestamped request without
    # one, "sig:<signature>": a hash of the body, not a secret.
    task = delivery.task
    return {"delivery": delivery.delivery_id, "receivedAt": _iso(delivery.received_at), "task": delivery.task_id,
            "taskTitle": task.title if task is not None else None, "taskState": task.state if task is not None else None}


def webhook_path(trigger: Trigger) -> str:
    return f"/hooks/{trigger.token}"


def present_trigger(trigger: Trigger, *, secret: str | None = None) -> dict[str, Any]:
    """``secret`` is passed only by create and rotate: the one time it is shown."""
    view: dict[str, Any] = {
        "id": trigger.pk,
        "name": trigger.name,
        "kind": trigger.kind,
        "source": trigger.source,
        "template": _template(trigger.template),
        "paused": trigger.paused,
        "origin": trigger.created_via,
        "createdByDevice": trigger.created_by_device_id,
        "createdByTask": trigger.created_by_task_id,
        "lastFiredAt": _iso(trigger.last_fired_at),
        "lastTask": trigger.last_task_id,
        "createdAt": _iso(trigger.created_at),
        "updatedAt": _iso(trigger.updated_at),
    }
    if trigger.kind == TriggerKind.WEBHOOK:
        view["path"] = webhook_path(trigger)
        view["rotating"] = trigger.rotating(timezone.now())
        view["previousSecretExpiresAt"] = _iso(trigger.previous_secret_expires_at) if view["rotating"] else None
    else:
        view["folder"] = trigger.folder
        view["settleSeconds"] = trigger.settle_seconds
    if secret is not None:
        view["secret"] = secret
    return view

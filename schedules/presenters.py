"""How schedules, their firings and triggers look to callers. Secrets never appear here."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, NotRequired, TypedDict

from django.utils import timezone

from boxsite.core.shapes import DateTime, Doc, Raw
from schedules.models import Delivery, Firing, Origin, Schedule, ScheduleStatus, Trigger, TriggerKind
from tasks.spec.describe import flow_schema
from tasks.states import State
from tasks.vault.facts import Facts

Template = Annotated[dict[str, Any], Raw({
    "type": "object",
    "description": "the task spec (a POST /api/tasks body) each task it starts is made from; secret facts shown as ${name}",
    "properties": {"title": {"type": "string"}, "prompt": {"type": "string"}, "worker": {"type": "string"},
                   "flow": {"anyOf": [flow_schema(), {"type": "null"}]},
                   "facts": {"type": "object"}, "secretFacts": {"type": "array", "items": {"type": "string"}}},
})]
TaskState = Annotated[str, State] | None


class FiringView(TypedDict):
    occurrence: DateTime | None
    firedAt: DateTime | None
    skipped: int
    skippedAtLeast: bool
    task: str | None
    taskTitle: str | None
    taskState: TaskState
    error: str | None


class ScheduleView(TypedDict):
    id: int
    name: str
    source: str
    cron: str | None
    timezone: str | None
    intervalSeconds: int | None
    cadence: str
    template: Template
    status: Annotated[str, ScheduleStatus]
    enabled: bool
    paused: bool
    disabledReason: str | None
    system: bool
    origin: Annotated[str, Origin]
    createdByDevice: int | None
    createdByTask: str | None
    createdByRun: Annotated[int | None, Doc("the number of that task's run that created it")]
    nextRunAt: DateTime | None
    lastRunAt: DateTime | None
    lastTask: str | None
    lastFiring: FiringView | None
    consecutiveFailures: int
    backoffUntil: DateTime | None
    needsAttention: bool
    lastError: str | None
    version: int
    createdAt: DateTime | None
    updatedAt: DateTime | None


class SchedulePage(TypedDict):
    results: list[ScheduleView]
    next: str | None


class FiringList(TypedDict):
    results: list[FiringView]


class TriggerView(TypedDict):
    id: int
    name: str
    kind: Annotated[str, TriggerKind]
    source: str
    template: Template
    paused: bool
    origin: Annotated[str, Origin]
    createdByDevice: int | None
    createdByTask: str | None
    lastFiredAt: DateTime | None
    lastTask: str | None
    createdAt: DateTime | None
    updatedAt: DateTime | None
    path: NotRequired[Annotated[str, Doc("webhook: where deliveries go")]]
    url: NotRequired[Annotated[str, Doc("webhook: the path as a full URL")]]
    rotating: NotRequired[bool]
    previousSecretExpiresAt: NotRequired[DateTime | None]
    folder: NotRequired[Annotated[str, Doc("file trigger: the watched folder")]]
    settleSeconds: NotRequired[float]
    secret: NotRequired[Annotated[str, Doc("only when created or rotated: shown once")]]


class TriggerPage(TypedDict):
    results: list[TriggerView]
    next: str | None


class DeliveryView(TypedDict):
    delivery: str
    receivedAt: DateTime | None
    task: str | None
    taskTitle: str | None
    taskState: TaskState


class DeliveryList(TypedDict):
    results: list[DeliveryView]


class WebhookReceived(TypedDict):
    task: str | None
    delivery: str | None
    duplicate: bool


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _template(template: dict[str, Any]) -> dict[str, Any]:
    """The template with its secret facts shown as ``${name}``, as task views show them."""
    facts = template.get("facts")
    if not isinstance(facts, dict) or not facts:
        return template
    secret = Facts.build(facts, template.get("secretFacts") or []).secret_names
    return {**template, "facts": {k: "${" + k + "}" if k in secret else v for k, v in facts.items()}}


def present_firing(firing: Firing) -> FiringView:
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


def present_schedule(schedule: Schedule, *, last_firing: Firing | None = None) -> ScheduleView:
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


def present_delivery(delivery: Delivery) -> DeliveryView:
    # A delivery id is the sender's (X-GitHub-Delivery) or, for a timestamped request without
    # one, "sig:<signature>": a hash of the body, not a secret.
    task = delivery.task
    return {"delivery": delivery.delivery_id, "receivedAt": _iso(delivery.received_at), "task": delivery.task_id,
            "taskTitle": task.title if task is not None else None, "taskState": task.state if task is not None else None}


def webhook_path(trigger: Trigger) -> str:
    return f"/hooks/{trigger.token}"


def present_trigger(trigger: Trigger, *, secret: str | None = None) -> TriggerView:
    """``secret`` is passed only by create and rotate: the one time it is shown."""
    view: TriggerView = {
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

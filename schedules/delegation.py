"""A schedule a running task creates: ``box schedule`` through its broker, or the
``schedule.create`` tool. The owner's policy and the bounds of what a task may create are
``tasks.tools.delegation``'s; this app adds schedules to it when the apps are ready."""
from __future__ import annotations

from typing import Any

from boxsite.core.principal import Principal
from schedules import services
from schedules.models import Schedule
from tasks.broker.protocol import InvalidArgs
from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.run.context import RunContext
from tasks.tools import delegation, registry
from tasks.tools.types import Tool


def create_schedule(ctx: RunContext, body: Any) -> Schedule:
    """A schedule made by ``ctx.task`` (as ``POST /api/schedules`` takes it; the template bounded)."""
    task = ctx.task

    def write() -> Schedule:
        delegation.check_policy(task, "schedules")
        if not isinstance(body, dict):
            raise InvalidArgs("a schedule is a JSON object: {name, cron | intervalSeconds, template}", field="schedule")
        bounded = {**body, "template": delegation.bounded(task, body.get("template"), "template")}
        schedule = services.create_schedule(Principal.of_task(task, ctx.run.number), bounded,
                                            by_task=task, by_run=ctx.run.number)
        record_event(task, EventKind.NOTE, f"created schedule {schedule.name}",
                     {"created": {"schedule": schedule.pk}, "run": ctx.run.number})
        return schedule

    return delegation.guarded(ctx, "a schedule", write)


def _created(ctx: Any, body: Any) -> dict[str, Any]:
    """The answer of the broker's call and of the tool alike."""
    schedule = create_schedule(ctx, body)
    return {"schedule": schedule.pk, "name": schedule.name,
            "nextRunAt": schedule.next_run_at.isoformat() if schedule.next_run_at else None}


def created_by(task: Task) -> int:
    return Schedule.objects.filter(created_by_task=task).count()


TOOL = Tool(
    name="schedule.create",
    description="Create a schedule {name, cron (with timezone) or intervalSeconds, template: a task spec}. Only "
                "when the owner allows tasks to create work; its tasks get no more than this task.",
    schema={"type": "object", "properties": {
        "name": {"type": "string"}, "cron": {"type": "string"}, "timezone": {"type": "string"},
        "intervalSeconds": {"type": "integer"}, "template": {"type": "object"}, "paused": {"type": "boolean"}},
        "required": ["name", "template"], "additionalProperties": False},
    impl=_created,
)


def add_to_tasks() -> None:
    """Called once by ``SchedulesConfig.ready``."""
    delegation.add_maker("schedule", delegation.Maker(create=_created, count=created_by))
    registry.register(TOOL)

"""Every change to a schedule: create, edit, pause, resume, delete, and the built-in ones.

Firing lives in ``schedules.tick``; triggers in ``schedules.triggers``. Views call these with the
principal asking; a task that manages schedules (through the broker) passes ``by_task``.
"""
from __future__ import annotations

import re
from typing import Any, TypeVar

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from boxsite.core.errors import Conflict, Forbidden, NotFound
from boxsite.core.principal import Principal, Via
from boxsite.core.validation import AnyText, AnyWhole, Body, Flag, Obj, Text, Whole
from schedules.cadence import Cadence
from schedules.models import Firing, Origin, Schedule, Trigger
from schedules.specs import check_template, fill, firing_principal
from tasks import services as task_services

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
NAME_RULE = "'name' must be 1-100 lowercase letters, digits, '-' or '_', starting with a letter or digit"


def name_field(**kwargs: Any) -> Text:
    """A schedule's or trigger's name (it becomes part of its tasks' source)."""
    return Text(pattern=NAME_RE.pattern, invalid=NAME_RULE, max_length=100, **kwargs)


class ScheduleBody(Body):
    """``POST /api/schedules``. The cadence is checked whole by ``Cadence.parse``, the template
    as a task spec by ``check_template``."""

    name = name_field()
    cron = AnyText(required=False, help_text="five fields; or give intervalSeconds")
    timezone = AnyText(required=False, help_text="an IANA name, for cron (default UTC)")
    intervalSeconds = AnyWhole(required=False)
    template = Obj(help_text="a task spec without 'source'")
    paused = Flag(required=False)


class ScheduleChangeBody(ScheduleBody):
    """``PATCH /api/schedules/<id>``: any of name, cadence and template (pause and resume are
    their own calls)."""

    name = name_field(required=False)
    template = Obj(required=False, help_text="a task spec without 'source'")
    paused = None  # type: ignore[assignment]  # not changed by PATCH
    version = Whole(required=False, help_text="the version you saw; another is CONFLICT")


def origin_of(principal: Principal, by_task: Any = None) -> str:
    if by_task is not None:
        return Origin.TASK
    if principal.via == Via.DEVICE:
        return Origin.DEVICE
    if principal.via in (Via.SESSION, Via.TOKEN):
        return Origin.OWNER
    return Origin.SYSTEM


def get_schedule_for(principal: Principal, schedule_id: Any, *, for_update: bool = False) -> Schedule:
    return get_owned_for(principal, Schedule, schedule_id, for_update=for_update)


Owned = TypeVar("Owned", Schedule, Trigger)


def get_owned_for(principal: Principal, model: type[Owned], object_id: Any, *, for_update: bool = False) -> Owned:
    """The schedule or trigger ``object_id`` of ``principal``'s user (locked with ``for_update``:
    the caller changes it); ``NotFound`` for any other id, another owner's included."""
    qs = model.objects.filter(owner=principal.user)
    if for_update:
        qs = qs.select_for_update()
    try:
        found = qs.filter(pk=int(object_id)).first()
    except (TypeError, ValueError):
        found = None
    if found is None:
        raise NotFound(f"no {model._meta.model_name} '{object_id}'", field="id")
    return found


def _may_change(principal: Principal, schedule: Schedule, by_task: Any) -> None:
    """System schedules are read-only to tasks; a device changes only what a device made."""
    if by_task is not None and schedule.system:
        raise Forbidden("a system schedule is read-only to tasks", field="id")
    if principal.via == Via.DEVICE and schedule.created_via != Origin.DEVICE:
        raise Forbidden("a paired device may change only the schedules it created", field="id")


def create_schedule(principal: Principal, body: Any, *, by_task: Any = None, by_run: int | None = None) -> Schedule:
    body = ScheduleBody.parse(body)
    name = body["name"]
    cadence = Cadence.parse(body.get("cron"), body.get("timezone"), body.get("intervalSeconds"))
    template = check_template(body.get("template"), principal.user, via=Via.SCHEDULE, source=f"schedule:{name}")
    paused = body.get("paused", False)
    now = timezone.now()
    try:
        with transaction.atomic():
            return Schedule.objects.create(
                owner=principal.user,
                name=name,
                cron=cadence.cron,
                timezone=cadence.timezone,
                interval_seconds=cadence.interval_seconds,
                template=template,
                paused=paused,
                next_run_at=None if paused else cadence.first_after(now),
                created_via=origin_of(principal, by_task),
                created_by_device=principal.device,
                created_by_task=by_task,
                created_by_run=by_run,
            )
    except IntegrityError as exc:
        raise Conflict(f"a schedule named '{name}' already exists", field="name") from exc


def update_schedule(principal: Principal, schedule_id: Any, body: Any, *, by_task: Any = None) -> Schedule:
    """Edit name, cadence or template. A new cadence restarts the cursor from now."""
    body = ScheduleChangeBody.parse(body)
    with transaction.atomic():
        # Locked: the tick may be firing this schedule; the edit waits for it (read-modify-write).
        schedule = get_schedule_for(principal, schedule_id, for_update=True)
        _may_change(principal, schedule, by_task)
        if schedule.system:
            raise Forbidden("a system schedule's name, cadence and template are built in; pause or resume it", field="id")
        if "version" in body and body["version"] != schedule.version:
            raise Conflict(f"the schedule changed (version {schedule.version}); reload and try again", field="version")
        name = body.get("name", schedule.name)
        cadence_keys = {"cron", "timezone", "intervalSeconds"} & set(body)
        if cadence_keys:
            if "cron" in body or "intervalSeconds" in body:
                cron, interval = body.get("cron"), body.get("intervalSeconds")
            else:
                cron, interval = schedule.cron or None, schedule.interval_seconds
            cadence = Cadence.parse(cron, body.get("timezone", schedule.timezone if cron else None), interval)
            schedule.cron, schedule.timezone, schedule.interval_seconds = cadence.cron, cadence.timezone, cadence.interval_seconds
            if schedule.next_run_at is not None:
                schedule.next_run_at = cadence.first_after(timezone.now())
        template = body.get("template", schedule.template)
        if "template" in body or "name" in body:
            template = check_template(template, schedule.owner, via=Via.SCHEDULE, source=f"schedule:{name}")
        schedule.name = name
        schedule.template = template
        schedule.version = F("version") + 1
        try:
            with transaction.atomic():
                schedule.save()
        except IntegrityError as exc:
            raise Conflict(f"a schedule named '{name}' already exists", field="name") from exc
    schedule.refresh_from_db()
    return schedule


def pause_schedule(principal: Principal, schedule_id: Any, *, by_task: Any = None) -> Schedule:
    with transaction.atomic():
        schedule = get_schedule_for(principal, schedule_id, for_update=True)
        _may_change(principal, schedule, by_task)
        if not schedule.paused:
            Schedule.objects.filter(pk=schedule.pk).update(
                paused=True, next_run_at=None, version=F("version") + 1, updated_at=timezone.now()
            )
    schedule.refresh_from_db()
    return schedule


def resume_schedule(principal: Principal, schedule_id: Any, *, by_task: Any = None) -> Schedule:
    """Resume (or re-enable after failures). Occurrences while paused are not owed: the cursor
    starts again from now, and the failure count starts from zero."""
    with transaction.atomic():
        schedule = get_schedule_for(principal, schedule_id, for_update=True)
        _may_change(principal, schedule, by_task)
        if schedule.paused or not schedule.enabled or schedule.next_run_at is None:
            Schedule.objects.filter(pk=schedule.pk).update(
                paused=False, enabled=True, disabled_reason="", consecutive_failures=0, backoff_until=None,
                needs_attention=False, next_run_at=schedule.cadence.first_after(timezone.now()),
                version=F("version") + 1, updated_at=timezone.now(),
            )
    schedule.refresh_from_db()
    return schedule


def run_schedule_now(principal: Principal, schedule_id: Any) -> Any:
    """Start the schedule's task now, by hand ("Run now"): recorded as a firing and as the
    schedule's last run (a run by hand is a run), and the schedule's own next run is left where
    it was. Paused and disabled schedules run too (that is what trying one out means). Returns
    the task."""
    schedule = get_schedule_for(principal, schedule_id)
    if "job" in schedule.template:
        raise Conflict("a built-in job runs on its own schedule; it starts no task", field="id")
    now = timezone.now()
    with transaction.atomic():
        task = task_services.create_task(fill(schedule.template, {}), firing_principal(schedule.owner, Via.SCHEDULE),
                                         source=schedule.source)
        task_services.note(task, f"started by hand from schedule '{schedule.name}' (Run now)",
                           {"schedule": schedule.name, "scheduleId": schedule.pk, "byHand": True})
        Firing.objects.create(schedule=schedule, occurrence=now, fired_at=now, task=task)
        Schedule.objects.filter(pk=schedule.pk).update(last_run_at=now, last_task=task, updated_at=now)
    return task


def delete_schedule(principal: Principal, schedule_id: Any, *, by_task: Any = None) -> None:
    with transaction.atomic():
        schedule = get_schedule_for(principal, schedule_id, for_update=True)
        _may_change(principal, schedule, by_task)
        if schedule.system:
            raise Forbidden("a system schedule cannot be deleted; pause it instead", field="id")
        schedule.delete()


def ensure_system_schedule(owner: Any, name: str, *, cron: str | None = None, timezone_name: str = "UTC",
                           interval_seconds: int | None = None, template: dict[str, Any]) -> Schedule:
    """Create or repair a built-in schedule (called at start-up). A stale template or cadence is
    replaced; a missing cursor is restored unless the owner paused it."""
    ScheduleChangeBody.parse({"name": name})
    cadence = Cadence.parse(cron, timezone_name if cron else None, interval_seconds)
    if "job" not in template:  # a job of the box's own (schedules.system), not a task spec
        check_template(template, owner, via=Via.SCHEDULE, source=f"schedule:{name}")
    with transaction.atomic():
        schedule, created = Schedule.objects.select_for_update().get_or_create(
            owner=owner, name=name,
            defaults={
                "cron": cadence.cron, "timezone": cadence.timezone, "interval_seconds": cadence.interval_seconds,
                "template": template, "system": True, "created_via": Origin.SYSTEM,
                "next_run_at": cadence.first_after(timezone.now()),
            },
        )
        if created:
            return schedule
        changed = (schedule.cron, schedule.timezone, schedule.interval_seconds, schedule.template, schedule.system, schedule.enabled) != (
            cadence.cron, cadence.timezone, cadence.interval_seconds, template, True, True
        ) or (schedule.next_run_at is None and not schedule.paused)
        if changed:
            schedule.cron, schedule.timezone, schedule.interval_seconds = cadence.cron, cadence.timezone, cadence.interval_seconds
            schedule.template, schedule.system, schedule.enabled, schedule.disabled_reason = template, True, True, ""
            schedule.created_via = Origin.SYSTEM
            if schedule.next_run_at is None and not schedule.paused:
                schedule.next_run_at = cadence.first_after(timezone.now())
            schedule.save()
    return schedule

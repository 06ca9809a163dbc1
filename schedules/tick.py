"""The schedule phase of the scheduler tick: fire what is due, exactly once per occurrence.

Each due schedule is fired in its own transaction that first re-reads the row under a lock and
re-checks that it is still due: ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL (a second
scheduler skips a row the first is firing, and after the first commits the row is no longer
due); on SQLite every transaction begins IMMEDIATE, so writers are serialized and the second
one re-reads the moved cursor. Either way a repeated or concurrent tick never fires the same
occurrence twice.

A tick with nothing due runs one indexed SELECT, writes nothing and logs nothing.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from boxsite.core.errors import BoxError, TooManyTasks
from boxsite.core.principal import Via
from schedules.models import Firing, Schedule
from schedules.specs import fill, firing_principal
from schedules.system import is_job, run_job
from tasks import services as task_services

log = logging.getLogger("box.schedules")

MAX_FAILURES = 5  # a user schedule is disabled after this many failed firings in a row
BATCH = 200  # schedules fired per tick at most; the rest are still due on the next tick
FIRINGS_KEPT = 200  # firing records kept per schedule


def backoff_seconds(failures: int) -> float:
    """Exponential: base, 2x, 4x ... capped (system schedules retry forever, so the cap matters)."""
    base = float(settings.BOX_SCHEDULE_BACKOFF_SECONDS)
    cap = float(settings.BOX_SCHEDULE_BACKOFF_MAX_SECONDS)
    return min(base * 2 ** max(failures - 1, 0), cap)


def _due(now: datetime) -> QuerySet[Schedule]:
    return Schedule.objects.filter(enabled=True, paused=False, next_run_at__lte=now).filter(
        Q(backoff_until__isnull=True) | Q(backoff_until__lte=now)
    )


def fire_due(now: datetime | None = None) -> int:
    """Fire every due schedule once; how many firings created a task."""
    now = now or timezone.now()
    due_ids = list(_due(now).order_by("next_run_at", "pk").values_list("pk", flat=True)[:BATCH])
    fired = 0
    for schedule_id in due_ids:
        try:
            firing = fire_one(schedule_id, now)
        except Exception as exc:  # noqa: BLE001 - one broken schedule must not starve the others;
            # it is logged with its traceback and backs off like any failed firing.
            log.exception("schedule %s crashed while firing", schedule_id)
            _record_crash(schedule_id, now, f"{type(exc).__name__}: {exc}")
            continue
        if firing is not None and firing.task_id is not None:
            fired += 1
    return fired


def _locked(schedule_id: int, now: datetime) -> Schedule | None:
    """The schedule, if still due, locked for this transaction (see the module docstring)."""
    qs = _due(now).filter(pk=schedule_id).select_related("owner")
    if connection.features.has_select_for_update_skip_locked:
        qs = qs.select_for_update(skip_locked=True, of=("self",))
    return qs.first()


def _fire_job(schedule: Schedule, now: datetime) -> Firing:
    """A built-in job (``schedules.system``): the cursor moves on in the firing's transaction,
    the job runs after it (outside any transaction: a long prune must not hold the database's
    write lock), and its outcome is recorded in a third. A failure is retried after the backoff."""
    occurrence = schedule.next_run_at or now
    catchup = schedule.cadence.catch_up(occurrence, now)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=catchup.next_run_at, last_run_at=now, updated_at=now)
    transaction.on_commit(lambda: _run_job(schedule.pk, dict(schedule.template), occurrence, now))
    return Firing(schedule=schedule, occurrence=occurrence, fired_at=now)


def _run_job(schedule_id: int, template: dict[str, Any], occurrence: datetime, now: datetime) -> None:
    try:
        run_job(template)
    except Exception as exc:  # noqa: BLE001 - recorded on the schedule; the box retries it
        log.exception("built-in job of schedule %s failed", schedule_id)
        with transaction.atomic():
            schedule = Schedule.objects.select_for_update().filter(pk=schedule_id).first()
            if schedule is not None:
                Schedule.objects.filter(pk=schedule_id).update(next_run_at=now)  # retried after the backoff
                schedule.next_run_at = occurrence
                _record_failure(schedule, now, f"{type(exc).__name__}: {exc}")
        return
    with transaction.atomic():
        Schedule.objects.filter(pk=schedule_id).update(consecutive_failures=0, backoff_until=None, needs_attention=False,
                                                       last_error="", updated_at=timezone.now())
        Firing.objects.create(schedule_id=schedule_id, occurrence=occurrence, fired_at=now)
        _prune_firings(schedule_id)


def fire_one(schedule_id: int, now: datetime) -> Firing | None:
    """Fire one schedule if it is still due. None when another scheduler got there first."""
    with transaction.atomic():
        schedule = _locked(schedule_id, now)
        if schedule is None:
            return None
        if schedule.system and is_job(schedule.template):
            return _fire_job(schedule, now)
        assert schedule.next_run_at is not None
        occurrence = schedule.next_run_at
        catchup = schedule.cadence.catch_up(occurrence, now)
        try:
            # A savepoint: a firing that fails leaves no task, only the failure record.
            with transaction.atomic():
                task = task_services.create_task(
                    fill(schedule.template, {}), firing_principal(schedule.owner, Via.SCHEDULE), source=schedule.source
                )
                task_services.note(task, _summary(schedule, catchup.skipped, catchup.capped), {
                    "schedule": schedule.name,
                    "scheduleId": schedule.pk,
                    "occurrence": occurrence.isoformat(),
                    "catchUp": catchup.skipped > 0,
                    "skipped": catchup.skipped,
                    "skippedAtLeast": catchup.capped,
                })
        except TooManyTasks as exc:
            return _defer(schedule, now, exc.message)
        except BoxError as exc:
            return _record_failure(schedule, now, exc.message)
        Schedule.objects.filter(pk=schedule.pk).update(
            next_run_at=catchup.next_run_at, last_run_at=now, last_task=task, consecutive_failures=0,
            backoff_until=None, needs_attention=False, last_error="", updated_at=now,
        )
        firing = Firing.objects.create(
            schedule=schedule, occurrence=occurrence, fired_at=now, skipped=catchup.skipped,
            skipped_at_least=catchup.capped, task=task,
        )
        _prune_firings(schedule.pk)
    if catchup.skipped:
        log.info("schedule %s fired once for %d missed occurrences (task %s)", schedule.name, catchup.due, task.pk)
    return firing


def _summary(schedule: Schedule, skipped: int, capped: bool) -> str:
    if not skipped:
        return f"started by schedule '{schedule.name}'"
    count = f"at least {skipped}" if capped else str(skipped)
    return f"catch-up firing of schedule '{schedule.name}': {count} missed occurrence(s) skipped"


def _record_failure(schedule: Schedule, now: datetime, error: str) -> Firing:
    """Call inside the firing's transaction, with the schedule locked."""
    failures = schedule.consecutive_failures + 1
    fields: dict[str, Any] = {"consecutive_failures": failures, "last_error": error[:2000], "updated_at": now}
    if not schedule.system and failures >= MAX_FAILURES:
        fields.update(
            enabled=False, next_run_at=None, backoff_until=None,
            disabled_reason=f"disabled after {failures} consecutive failed firings; the last: {error}"[:2000],
        )
        log.warning("schedule %s disabled after %d failed firings: %s", schedule.name, failures, error)
    else:
        fields["backoff_until"] = now + timedelta(seconds=backoff_seconds(failures))
        if schedule.system and failures >= MAX_FAILURES:
            fields["needs_attention"] = True
        log.warning("schedule %s failed to fire (%d in a row), retrying after %s: %s",
                    schedule.name, failures, fields["backoff_until"].isoformat(), error)
    Schedule.objects.filter(pk=schedule.pk).update(**fields)
    firing = Firing.objects.create(schedule=schedule, occurrence=schedule.next_run_at or now, fired_at=now, error=error[:2000])
    _prune_firings(schedule.pk)
    return firing


def _defer(schedule: Schedule, now: datetime, error: str) -> Firing:
    """The box is at capacity: not the schedule's fault, so the occurrence stays owed and is
    retried after the base backoff without counting towards disabling the schedule."""
    retry_at = now + timedelta(seconds=float(settings.BOX_SCHEDULE_BACKOFF_SECONDS))
    Schedule.objects.filter(pk=schedule.pk).update(backoff_until=retry_at, last_error=error[:2000], updated_at=now)
    firing = Firing.objects.create(schedule=schedule, occurrence=schedule.next_run_at or now, fired_at=now,
                                   error=f"deferred: {error}"[:2000])
    _prune_firings(schedule.pk)
    return firing


def _record_crash(schedule_id: int, now: datetime, error: str) -> None:
    with transaction.atomic():
        schedule = _locked(schedule_id, now)
        if schedule is not None:
            _record_failure(schedule, now, error)


def _prune_firings(schedule_id: int) -> None:
    cutoff = Firing.objects.filter(schedule_id=schedule_id).order_by("-id").values_list("id", flat=True)[FIRINGS_KEPT:FIRINGS_KEPT + 1]
    oldest_kept = list(cutoff)
    if oldest_kept:
        Firing.objects.filter(schedule_id=schedule_id, id__lte=oldest_kept[0]).delete()

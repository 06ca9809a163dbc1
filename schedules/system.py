"""The box's own schedules (docs/guide/schedules.md#built-in-schedules): jobs the box runs for itself,
kept as system schedules so they show on the Schedules page (built in, read-only, with attention
when they keep failing) and fire through the same exactly-once tick as the owner's.

A job schedule's template is ``{"title", "job"}``: firing it runs the job, not a task (a task
spec never has ``job``, so only the box makes one). ``reconcile`` creates missing ones and repairs
stale or disabled ones at start-up, and hourly for an owner created since.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model

from boxsite.core.idempotency import forget_expired
from schedules.services import ensure_system_schedule
from tasks.layers.task_view import refresh_workspace
from tasks.models import Workspace
from tasks.retention import prune_expired

log = logging.getLogger("box.schedules")


def compact_layers() -> None:
    """Every workspace: build the flats its next task needs, delete flats and undone layers that
    nobody reads."""
    for workspace in Workspace.objects.all():
        refresh_workspace(workspace)


def prune() -> None:
    prune_expired()
    forgotten = forget_expired()
    if forgotten:
        log.info("forgot %d idempotency keys past their 24 hours", forgotten)


@dataclass(frozen=True)
class Job:
    name: str
    title: str
    every_s: int
    run: Callable[[], Any]

    @property
    def template(self) -> dict[str, Any]:
        return {"title": self.title, "job": self.name}


JOBS = {job.name: job for job in (
    Job("retention", "Forget ended tasks past the retention window", 3600, prune),
    Job("compaction", "Compact deep layer stacks and delete layers nobody reads", 3600, compact_layers),
)}


def is_job(template: Any) -> bool:
    return isinstance(template, dict) and "job" in template


def run_job(template: dict[str, Any]) -> None:
    """Run a job schedule's job; an unknown job is an error its firing records."""
    job = JOBS.get(str(template.get("job")))
    if job is None:
        raise LookupError(f"the box has no job '{template.get('job')}'")
    job.run()


def reconcile() -> int:
    """Create or repair every built-in schedule of the box's owner. How many exist."""
    count = 0
    for owner in get_user_model().objects.filter(is_superuser=True, is_active=True):
        for job in JOBS.values():
            ensure_system_schedule(owner, f"box-{job.name}", interval_seconds=job.every_s, template=job.template)
            count += 1
    return count

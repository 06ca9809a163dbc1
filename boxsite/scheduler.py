"""The scheduler process's tick: each phase runs on its own, so one failing phase cannot starve
the others. Healthy ticks with nothing to do write nothing and log nothing."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.db import close_old_connections

log = logging.getLogger("box.scheduler")


def _reap() -> None:
    from tasks.runs import reap_expired

    reap_expired()


def _dispatch() -> None:
    from tasks.runs import dispatch_due

    dispatch_due()


def _fire_schedules() -> None:
    from schedules.tick import fire_due

    fire_due()


def _scan_files() -> None:
    from schedules.files import scan_all

    scan_all()


# Order matters: retries publish before schedules fire (a recovered run is older work).
RETENTION_EVERY_S = 3600.0
_last_retention = 0.0


def _prune() -> None:
    """Hourly (and once at start): forget ended tasks past the retention window."""
    global _last_retention
    now = time.monotonic()
    if _last_retention and now - _last_retention < RETENTION_EVERY_S:
        return
    _last_retention = now
    from tasks.retention import prune_expired

    prune_expired()


PHASES: list[tuple[str, Callable[[], None]]] = [
    ("reap expired leases", _reap),
    ("dispatch due runs", _dispatch),
    ("fire due schedules", _fire_schedules),
    ("scan file-arrival folders", _scan_files),
    ("prune past retention", _prune),
]


def tick() -> None:
    close_old_connections()
    for name, phase in PHASES:
        try:
            phase()
        except Exception:  # noqa: BLE001 - logged, and the next phase still runs
            log.exception("scheduler phase %r failed", name)


def on_start() -> None:
    """Reconcile what a crash of the box may have left behind."""
    from tasks.lifecycle import reconcile
    from tasks.runs import resend_unclaimed, resume_after_restart

    reconcile()
    resend_unclaimed()
    resume_after_restart()  # after the re-send: the retries it queues are sent once, by their commit

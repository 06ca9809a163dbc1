"""The scheduler process's tick: each phase runs on its own, so one failing phase cannot starve
the others. Healthy ticks with nothing to do write nothing and log nothing."""
from __future__ import annotations

import logging
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
PHASES: list[tuple[str, Callable[[], None]]] = [
    ("reap expired leases", _reap),
    ("dispatch due runs", _dispatch),
    ("fire due schedules", _fire_schedules),
    ("scan file-arrival folders", _scan_files),
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

    reconcile()

"""The scheduler process's tick: each phase runs on its own, so one failing phase cannot starve
the others. Healthy ticks with nothing to do write nothing and log nothing."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections

from schedules.files import scan_all
from schedules.system import reconcile as reconcile_system_schedules
from schedules.tick import fire_due
from tasks import layers
from tasks.machines import moves
from tasks.run.leases import dispatch_due, resend_unclaimed
from tasks.run.lifecycle import reconcile
from tasks.run.reaper import reap_expired, resume_after_restart
from tasks.services import release_waiting

log = logging.getLogger("box.scheduler")

RECONCILE_EVERY_S = 3600.0
_last_reconcile = 0.0


def _builtin_schedules() -> None:
    """Hourly (and once at start): the built-in schedules exist and are sound (an owner created
    since the start gets them too). Retention and compaction run as those schedules. And the
    override notes a worker's crash left due after their layer's seal are written, so one does
    not wait for the box's next start."""
    global _last_reconcile
    now = time.monotonic()
    if _last_reconcile and now - _last_reconcile < RECONCILE_EVERY_S:
        return
    _last_reconcile = now
    reconcile_system_schedules()
    layers.write_due_notes()


# Order matters: retries publish before schedules fire (a recovered run is older work).
PHASES: list[tuple[str, Callable[[], object]]] = [
    ("reap expired leases", reap_expired),
    ("dispatch due runs", dispatch_due),
    ("start tasks their dependencies released", release_waiting),
    ("fire due schedules", fire_due),
    ("scan file-arrival folders", scan_all),
    ("built-in schedules", _builtin_schedules),
]
if settings.BOX_MACHINE:
    # Several machines: the workspaces of a machine gone silent move to a live one.
    PHASES.append(("hand over gone machines' workspaces", moves.hand_over))


def run_phases(phases: list[tuple[str, Callable[[], object]]]) -> list[tuple[str, Callable[[], object]]]:
    """Run each phase on its own; return the ones that failed (each logged). A failed phase
    may have left its connection broken (a terminated backend): the next phase gets a fresh one."""
    failed = []
    close_old_connections()
    for name, phase in phases:
        try:
            phase()
        except Exception:  # noqa: BLE001 - logged, and the next phase still runs
            log.exception("scheduler phase %r failed", name)
            failed.append((name, phase))
            close_old_connections()
    return failed


def tick() -> None:
    run_phases(PHASES)


def process_started_at() -> datetime:
    """When this process started (from /proc), not when Django finished loading in it."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
    return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), tz=UTC)


def start_phases() -> list[tuple[str, Callable[[], object]]]:
    """What the scheduler does once at start: reconcile what a crash of the box may have left
    behind, re-send what the queue may have lost, resume runs a restart cut off. The process
    retries any of them that failed (a database fault at start) before each tick until it
    succeeds: a scheduler never exits because its database had a bad moment."""
    started = process_started_at()
    return [
        ("reconcile leftovers", reconcile),
        ("built-in schedules", reconcile_system_schedules),
        ("re-send unclaimed runs", resend_unclaimed),
        # After the re-send: the retries it queues are sent once, by their commit.
        ("resume runs a restart cut off", lambda: resume_after_restart(started_before=started)),
    ]

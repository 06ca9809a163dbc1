"""File-arrival triggers: one task per new file in a watched folder, once it stops changing.

Each scan (a scheduler phase) lists the folder's regular files, top level only, skipping hidden
files and the usual partial-download names (``.part``, ``.tmp``, ``.crdownload``, ``~$...``).

- A file seen for the first time with a given (size, mtime) is recorded as *settling*.
- A later scan that finds the same (size, mtime), at least ``settle_seconds`` after its mtime,
  starts the task and marks the record *started*, in one transaction with a conditional update,
  so two scanners never both start it.
- A file that changed between scans gets a new settling record (the old one is dropped), so a
  file still being written is not picked up until it is stable.

On a box of several machines (``BOX_MACHINE``) a trigger's folder is on one machine's disk
(``Trigger.machine``), and only that machine's scheduler scans it: another would list a missing
folder, or a different folder at the same path.

The record's (trigger, path, size, mtime) is unique and kept, so the same file never starts a
second task, across scans, restarts or a second scheduler. A file replaced by a different one
(new size or mtime) is a new arrival. The task gets ``file.path`` (absolute), ``file.name``,
``file.size`` and ``file.mtime`` as facts. A scan that finds nothing new writes nothing.
"""
from __future__ import annotations

import logging
import os
from datetime import UTC, datetime

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from boxsite.core.errors import BoxError
from boxsite.core.principal import Via
from schedules.models import SeenFile, SeenState, Trigger, TriggerKind
from schedules.specs import fill, firing_principal
from tasks import services as task_services

log = logging.getLogger("box.schedules")

PARTIAL_SUFFIXES = (".part", ".partial", ".tmp", ".crdownload", ".download", ".swp")


def _ignored(name: str) -> bool:
    return name.startswith((".", "~$")) or name.lower().endswith(PARTIAL_SUFFIXES)


def _listing(folder: str) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of the folder's regular files. A folder that has gone away is
    empty (the trigger waits for it to come back)."""
    found: dict[str, tuple[int, int]] = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if _ignored(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
                found[entry.path] = (st.st_size, st.st_mtime_ns)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        log.debug("watched folder %s cannot be listed", folder)
    return found


def scan_all() -> int:
    """Scan every active file trigger; how many tasks were started. On a box of several machines,
    only those whose folder is on this machine (a trigger named before the box had several is
    taken by the first machine that has its folder)."""
    triggers = Trigger.objects.filter(kind=TriggerKind.FILE, paused=False).select_related("owner")
    if settings.BOX_MACHINE:
        for trigger in triggers.filter(machine=""):
            if os.path.isdir(trigger.folder):
                Trigger.objects.filter(pk=trigger.pk, machine="").update(machine=settings.BOX_MACHINE)
        triggers = triggers.filter(machine=settings.BOX_MACHINE)
    started = 0
    for trigger in triggers:
        started += scan(trigger)
    return started


def scan(trigger: Trigger) -> int:
    files = _listing(trigger.folder)
    if not files:
        return 0
    known: dict[str, list[tuple[int, int, str, int]]] = {}
    for path, size, mtime_ns, state, pk in SeenFile.objects.filter(trigger=trigger).values_list(
        "path", "size", "mtime_ns", "state", "pk"
    ):
        known.setdefault(path, []).append((size, mtime_ns, state, pk))
    now_ns = int(timezone.now().timestamp() * 1e9)
    started = 0
    for path, (size, mtime_ns) in sorted(files.items()):
        match = next((r for r in known.get(path, []) if r[0] == size and r[1] == mtime_ns), None)
        if match is None:
            _observe(trigger, path, size, mtime_ns)
        elif match[2] == SeenState.SETTLING and now_ns - mtime_ns >= trigger.settle_seconds * 1e9:
            started += _start(trigger, match[3], path, size, mtime_ns)
    return started


def _observe(trigger: Trigger, path: str, size: int, mtime_ns: int) -> None:
    with transaction.atomic():
        # An earlier, different version of this file that never settled is not owed a task.
        SeenFile.objects.filter(trigger=trigger, path=path, state=SeenState.SETTLING).delete()
        try:
            with transaction.atomic():
                SeenFile.objects.create(trigger=trigger, path=path, size=size, mtime_ns=mtime_ns)
        except IntegrityError:
            pass  # another scanner recorded the same observation first; nothing is lost


def _start(trigger: Trigger, seen_id: int, path: str, size: int, mtime_ns: int) -> int:
    facts = {
        "file.path": path,
        "file.name": os.path.basename(path),
        "file.size": str(size),
        "file.mtime": datetime.fromtimestamp(mtime_ns / 1e9, tz=UTC).isoformat(),
    }
    try:
        with transaction.atomic():
            claimed = SeenFile.objects.filter(pk=seen_id, state=SeenState.SETTLING).update(state=SeenState.STARTED)
            if claimed != 1:
                return 0  # another scanner started it
            task = task_services.create_task(
                fill(trigger.template, facts), firing_principal(trigger.owner, Via.FILE), source=trigger.source
            )
            SeenFile.objects.filter(pk=seen_id).update(task=task)
            Trigger.objects.filter(pk=trigger.pk).update(last_fired_at=timezone.now(), last_task=task)
    except BoxError as exc:
        # Rolled back: the file stays settling and the next scan tries again.
        log.warning("file trigger %s could not start a task for %s: %s", trigger.name, path, exc.message)
        return 0
    return 1

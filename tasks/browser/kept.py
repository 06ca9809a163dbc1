"""A browser kept across a pause (``BrowserSession.park``): how long it may sit idle.

A kept Chromium holds memory in the task's control group (it is a process of the task, started
by ``tasks.sandbox.launcher`` like every other, so it counts against the task's ``memory_mb``)
and a page a person may have signed in to. It stays while the task waits and someone uses it:
every input relayed from the live view (``tasks.browser.screencast``) and every run that attaches
to it touches its record, and ``watch`` closes it once the record has not been touched for
``BOX_BROWSER_IDLE_SECONDS`` while the task is waiting, with a note in the task's log. A task
that is running again is never idle: its run holds the browser.
"""
from __future__ import annotations

import logging
import os
import subprocess
import time

from django.conf import settings
from django.db import connection, transaction

from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.sandbox import launcher, paths
from tasks.states import State

log = logging.getLogger(__name__)

CHECK_S = 30.0  # the longest the watcher sleeps between two looks at the record
TOUCH_EVERY_S = 5.0  # the live view touches the record at most this often


def idle_limit_s() -> float:
    return float(settings.BOX_BROWSER_IDLE_SECONDS)


def touch(task_id: str) -> None:
    """Someone used the kept browser now (a relayed input, a run attaching to it)."""
    try:
        os.utime(paths.kept_browser(task_id))
    except OSError:
        pass  # no record: nothing is kept, nothing to keep alive


def last_used(task_id: str) -> float | None:
    """When the kept browser was last used (its record's time), or None without a record."""
    try:
        return os.stat(paths.kept_browser(task_id)).st_mtime
    except OSError:
        return None


def watch(task_id: str, proc: subprocess.Popen[bytes]) -> bool:
    """Wait until the kept Chromium ``proc`` exits. When it sits idle past the limit while the
    task waits, it is killed and the task's log says so; True then."""
    limit = idle_limit_s()
    while True:
        used = last_used(task_id)
        if limit <= 0 or used is None:
            proc.wait()
            return False
        left = used + limit - time.time()
        try:
            proc.wait(timeout=min(max(left, 0.05), CHECK_S))
            return False
        except subprocess.TimeoutExpired:
            pass
        used = last_used(task_id)
        if used is None or time.time() - used < limit or not _waiting(task_id):
            continue
        launcher.kill(proc)
        proc.wait(timeout=10)
        _note(task_id, limit)
        return True


def _waiting(task_id: str) -> bool:
    try:
        return Task.objects.filter(pk=task_id, state=State.WAITING).exists()
    finally:
        connection.close()  # this thread outlives the request for a database it holds


def _note(task_id: str, limit: float) -> None:
    minutes = limit / 60
    said = f"{minutes:g} min" if limit >= 60 else f"{limit:g} s"
    try:
        task = Task.objects.get(pk=task_id)
        with transaction.atomic():
            record_event(task, EventKind.NOTE, f"the kept browser was closed: nobody used it for {said} "
                         "(BOX_BROWSER_IDLE_SECONDS); continuing opens the page again",
                         {"browser": True, "idleClosed": True, "idleSeconds": limit})
    except Exception:  # noqa: BLE001 - the browser is closed either way; the log line is what is lost
        log.warning("noting task %s's idle browser failed", task_id, exc_info=True)
    finally:
        connection.close()

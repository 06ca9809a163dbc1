"""The worker's heartbeats: each run in hand has its lease extended every
``BOX_HEARTBEAT_SECONDS`` by the process's one heartbeat thread, and is told to stop once its
lease is gone (taken over, cancelled, finished elsewhere)."""
from __future__ import annotations

import logging
import os
import threading
import time

from django.conf import settings
from django.db import connection

from tasks.run import leases as runs
from tasks.run.recorder import RETRY_PAUSE_S

log = logging.getLogger(__name__)


class Heartbeat:
    """One run's lease, extended while the worker works (by ``Heartbeats``); ``stop_event`` is
    set once the lease is gone."""

    def __init__(self, run_id: int, token: str, stop: threading.Event) -> None:
        self.run_id, self.token, self.stop_event = run_id, token, stop
        self.due = time.monotonic() + settings.BOX_HEARTBEAT_SECONDS


class Heartbeats:
    """The process's one heartbeat thread, kept for its life: it beats for every run it watches
    (in a worker, the run in hand), so a run's start never waits for a new thread to take the
    GIL. Started on first use; a forked child (a django-q2 worker) starts its own. Its database
    connection is closed whenever it watches nothing, so an idle worker holds none for it."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._watched: set[Heartbeat] = set()
        self._thread: threading.Thread | None = None

    def watch(self, run_id: int, token: str, stop: threading.Event) -> Heartbeat:
        """Extend run ``run_id``'s lease from now on, until ``forget``."""
        heartbeat = Heartbeat(run_id, token, stop)
        with self._changed:
            self._watched.add(heartbeat)
            if self._thread is None or not self._thread.is_alive():  # started once; again only if it died
                self._thread = threading.Thread(target=self._beat, name="box-heartbeats", daemon=True)
                self._thread.start()  # once per process, not on each run's path
            self._changed.notify()
        return heartbeat

    def forget(self, heartbeat: Heartbeat) -> None:
        """The run's work is over: it is not beaten again, but for a beat already begun (which
        then matches nothing, or extends a lease the run's finish is about to close)."""
        with self._changed:
            self._watched.discard(heartbeat)
            self._changed.notify()

    def _beat(self) -> None:
        while True:
            try:
                self._beat_due()
            except Exception:  # noqa: BLE001 - the one thread of every run of the process must go on
                log.exception("the heartbeat thread failed; it goes on")
                time.sleep(RETRY_PAUSE_S)

    def _beat_due(self) -> None:
        for heartbeat in self._due():
            try:
                alive = runs.heartbeat(heartbeat.run_id, heartbeat.token)
            except Exception:  # noqa: BLE001 - a busy database is retried next beat
                log.warning("heartbeat for run %s failed; retrying", heartbeat.run_id, exc_info=True)
                # On a fresh connection: this thread's may be broken for good (a terminated
                # backend), and nothing else in a thread ever replaces it.
                connection.close()
                alive = True
            with self._changed:
                if not alive and heartbeat in self._watched:
                    self._watched.discard(heartbeat)
                    heartbeat.stop_event.set()
                heartbeat.due = time.monotonic() + settings.BOX_HEARTBEAT_SECONDS

    def _due(self) -> list[Heartbeat]:
        """Wait until a watched run's beat is due: those runs. While nothing is watched the
        thread's connection is closed (out of the lock: ``watch`` never waits for it)."""
        closed = False
        while True:
            with self._changed:
                now = time.monotonic()
                due = [heartbeat for heartbeat in self._watched if heartbeat.due <= now]
                if due:
                    return due
                if self._watched:
                    self._changed.wait(min(heartbeat.due for heartbeat in self._watched) - now)
                    continue
                if closed:
                    self._changed.wait()
                    continue
            connection.close()  # this thread's own; the next beat opens one again
            closed = True


heartbeats = Heartbeats()

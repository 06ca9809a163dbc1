"""A thread per process that runs jobs one at a time, in the order they came: the janitor
(``tasks.run.lifecycle``: releases after a task ended) and the sealer (``tasks.layers.sealer``: a done
task's layer sealed beside its finish).

The thread starts with the first job in each process (a django-q2 worker, forked, starts its
own) and keeps its database connection while jobs come: in a chain of tasks they come close
together, and a connection made for each costs more than the job's own statements (a server
process started per connection on PostgreSQL). It lets go of it after
``IDLE_CONNECTION_S`` without a job, at a ``drain`` (a process's end, a test's), and before a job
when the one before failed on it (a database restart, a terminated server process).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import queue
import threading
import time
from collections.abc import Callable

from django.db import connection

log = logging.getLogger(__name__)

Job = Callable[[], None]

IDLE_CONNECTION_S = 2.0


def _hang_up() -> None:
    """A job that lets go of the thread's database connection now (``Background.drain``)."""
    connection.close()


def close_if_broken() -> None:
    """Close this thread's database connection if a statement failed on it (a database restart,
    a terminated server process): the next statement makes a new one, with no round trip to find
    out first."""
    if connection.errors_occurred:
        connection.close()


class Background:
    """Jobs run by a thread of this process, one at a time. A job that raises is logged and the
    next one runs: whatever it left undone is the caller's to repair (start-up reconcile).
    ``quiet_wait``: how long to wait for a job before calling ``on_quiet`` (None: no wait due)."""

    def __init__(self, name: str, *, quiet_wait: Callable[[], float | None] = lambda: None,
                 on_quiet: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self._quiet_wait, self._on_quiet = quiet_wait, on_quiet
        self._lock = threading.Lock()
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._pid = 0
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child (a django-q2 worker) starts its own thread
                self._jobs, self._pid = queue.Queue(), os.getpid()
                threading.Thread(target=self._work, args=(self._jobs,), name=self.name, daemon=True).start()
                atexit.register(self.drain)  # an ordinary exit (a management command)
                multiprocessing.util.Finalize(self, self.drain, exitpriority=10)  # a django-q2 worker's exit
            self._jobs.put(job)
            self._idle.clear()  # under the lock, as ``_done``'s check: a drain never misses this job

    def _work(self, jobs: queue.Queue[Job]) -> None:
        while True:
            connected = connection.connection is not None
            wait = self._quiet_wait()
            if connected:
                wait = IDLE_CONNECTION_S if wait is None else min(wait, IDLE_CONNECTION_S)
            try:
                job = jobs.get(timeout=wait)
            except queue.Empty:
                if connected:
                    connection.close()  # hold no database connection while idle
                else:
                    self._on_quiet()
                continue
            close_if_broken()  # the job before failed on it
            try:
                job()
            except Exception:  # noqa: BLE001 - the thread outlives one failure; the job's owner repairs
                log.exception("%s: a job failed", self.name)
            finally:
                jobs.task_done()
                with self._lock:  # no job submitted between the count and the flag
                    if jobs.unfinished_tasks == 0:
                        self._idle.set()

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every job submitted in this process is done and the thread has let go of
        its database connection (False at the timeout)."""
        if self._pid != os.getpid():
            return True
        self.submit(_hang_up)
        return self.wait_idle(timeout)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every job submitted in this process is done (False at the timeout); the
        thread may still hold its database connection (``IDLE_CONNECTION_S``)."""
        if self._pid != os.getpid():
            return True
        deadline = time.monotonic() + timeout
        while not self._idle.wait(0.05):
            if time.monotonic() > deadline:
                return False
        return True

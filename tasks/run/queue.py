"""The embedded queue (django-q2's ORM broker) with a wake-up instead of a poll's wait.

django-q2's ORM broker finds new jobs by polling its table every ``poll`` seconds: a run waits half
a poll on average before it even starts. Here each cluster's pusher, when the table is
empty, waits on a datagram socket of its own instead of sleeping, and every enqueue sends one
byte to each registered pusher after the job's row is written: the pusher reads the table at
once. The poll stays as the fallback (a lost datagram costs at most one poll).

Pushers register as files named by their pid in ``BOX_LOCAL_DIR/queue-wake/<queue>/`` (0700, the
box's own) and listen on an abstract Unix socket named after the directory and pid: a task in
its own network namespace cannot reach it, and a dead pusher's socket is gone (the sender gets
ECONNREFUSED and removes the stale file). Only this machine's pushers are woken; the ORM queue
serves one machine (docs/internals/scaling.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import select
import socket
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ

from tasks import sql


def _wake_dir(list_key: str) -> Path:
    local = Path(settings.BOX_LOCAL_DIR or settings.BOX_DATA_DIR)
    return local / "queue-wake" / hashlib.sha256(list_key.encode()).hexdigest()[:16]


def _address(directory: Path, pid: int) -> bytes:
    digest = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:24]
    return f"\0box-queue-{digest}-{pid}".encode()


def _connection() -> BaseDatabaseWrapper:
    """The database the queue's table is in (django-q2's ``orm`` setting, else the default)."""
    return connections[Conf.ORM or DEFAULT_DB_ALIAS]


class WakingORM(ORM):
    """django-q2's ORM broker whose pusher is woken by each enqueue (``Q_CLUSTER['broker_class']``)."""

    def __init__(self, list_key: str = "") -> None:
        super().__init__(list_key=list_key)
        self._listener: socket.socket | None = None
        self._listener_pid = 0

    def enqueue(self, task: Any) -> Any:
        # django-q2's broker first closes the caller's connection when it is past its age (for
        # its own pusher thread); every process that enqueues here already manages its own (a
        # request's end, a job's end, the scheduler's phases), and the web paid a reconnect for
        # it twice per POST.
        job = OrmQ.objects.using(Conf.ORM).create(key=self.list_key or Conf.CLUSTER_NAME, payload=task, lock=timezone.now())
        self._wake_pushers()
        return job.pk

    def dequeue(self) -> list[tuple[Any, Any]] | None:
        # The pusher reads the table once or twice per job (``tasks.sql``'s statements).
        self.get_connection()  # django-q2's: a connection past its age is closed first
        connection = _connection()
        taken = []
        for pk, payload, lock in sql.due_jobs(connection, self.list_key, timezone.now(), Conf.BULK):
            # Another cluster may take it between the read and this update: then it is theirs.
            if sql.take_job(connection, pk, lock, self._lock_until()):
                taken.append((pk, payload))
        if taken:
            return taken
        self._wait(Conf.POLL)
        return None

    def delete(self, task_id: Any) -> None:
        # Each job's acknowledgement: a plain DELETE (the ORM's looked for related rows first).
        self.get_connection()
        sql.delete_job(_connection(), task_id)

    def _lock_until(self) -> datetime:
        return timezone.now() + timedelta(seconds=Conf.RETRY)

    # --- the wake-up --------------------------------------------------------------------------

    def _wait(self, timeout: float) -> None:
        listener = self._listen()
        if listener is None:
            return
        ready, _, _ = select.select([listener], [], [], timeout)
        if ready:
            with contextlib.suppress(BlockingIOError):
                while listener.recv(64):  # every wake-up sent so far: one read of the table serves them all
                    pass

    def _listen(self) -> socket.socket | None:
        if self._listener is not None and self._listener_pid == os.getpid():
            return self._listener
        directory = _wake_dir(self.list_key or Conf.CLUSTER_NAME)
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            listener.bind(_address(directory, os.getpid()))
            (directory / str(os.getpid())).touch()
        except OSError:
            return None  # no wake-ups: the poll alone, as django-q2 does
        self._listener, self._listener_pid = listener, os.getpid()
        return listener

    def _wake_pushers(self) -> None:
        directory = _wake_dir(self.list_key or Conf.CLUSTER_NAME)
        try:
            entries = [entry.name for entry in os.scandir(directory) if entry.name.isdigit()]
        except FileNotFoundError:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC) as sender:
            for name in entries:
                try:
                    sender.sendto(b"!", _address(directory, int(name)))
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(FileNotFoundError):
                        (directory / name).unlink()  # that pusher is gone
                except OSError:
                    continue  # its buffer is full: it has wake-ups enough

"""Django's SQLite backend whose writers queue on a file lock instead of SQLite's busy handler.

SQLite lets one writer in at a time; a writer that finds the lock taken sleeps in the busy
handler's growing steps and retries, so it often sleeps well past the moment the lock is free,
and the box's writers (web, workers, janitors, scheduler) wait on each
other all the time. Here every write transaction first takes an exclusive ``flock`` on a file
beside the database (``<database>-gate``), from its ``BEGIN IMMEDIATE`` to its commit or
rollback, and so does a write statement outside a transaction: a waiting writer is woken by the
kernel the moment the gate is free, and then finds SQLite's lock free too.

The wait is bounded by the database's busy timeout, as SQLite's own is: a writer that gives up
raises "database is locked", the error SQLite's own wait raises. So a connection holding the
gate while it waits for something a waiting writer holds (a layer's lock, a thread of its own
process) is no deadlock: the waiter gives up, as it gives up on SQLite's lock. Anything
that writes without the gate (the sqlite3 shell, another program) still meets SQLite's lock
and its busy handler.
"""
from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from typing import Any

from django.db import OperationalError
from django.db.backends.sqlite3 import base

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


class Gate:
    """One holder at a time of the exclusive lock on ``path``, across threads and processes
    (each holder opens the file itself: flock locks belong to an open file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def acquire(self, timeout: float) -> None:
        """Take the lock, waiting at most ``timeout`` seconds; OperationalError past that."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not _wait_for_lock(fd, timeout):
                raise OperationalError("database is locked (waited for the writer gate)") from None
        self._fd, self._pid = fd, os.getpid()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._pid == os.getpid():
            # Unlocked before the close: a process forked meanwhile shares this open file and
            # would otherwise keep the lock until it closed its copy.
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _wait_for_lock(fd: int, timeout: float) -> bool:
    """Block in ``flock`` on a helper thread (a blocking flock cannot be given a timeout) and
    wait for it at most ``timeout`` seconds. True once ``fd`` holds the lock; on False the fd is
    closed, and the helper lets the lock go as soon as it gets it."""
    done = threading.Event()
    guard = threading.Lock()
    state = {"abandoned": False}

    def take() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with guard:
            if state["abandoned"]:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                return
            done.set()

    threading.Thread(target=take, name="sqlite-writer-gate", daemon=True).start()
    if done.wait(timeout):
        return True
    with guard:
        if done.is_set():
            return True
        state["abandoned"] = True
    return False


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writer_gate = Gate(f"{self.settings_dict['NAME']}-gate")
        self.execute_wrappers.insert(0, _gate_autocommit_writes)

    def _gated(self) -> bool:
        return not self.is_in_memory_db() and not self.writer_gate.held

    def _take_gate(self) -> None:
        self.writer_gate.path = f"{self.settings_dict['NAME']}-gate"  # a test run swaps the name in
        self.writer_gate.acquire(float(self.settings_dict["OPTIONS"].get("timeout", 5.0)))

    def _start_transaction_under_autocommit(self) -> None:
        if not self._gated():
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private in the stubs
            return
        self._take_gate()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # private in the stubs
        except BaseException:
            self.writer_gate.release()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]  # private in the stubs
        finally:
            self._let_go_unless_open()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # private in the stubs
        finally:
            self._let_go_unless_open()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]  # private in the stubs
        finally:
            self.writer_gate.release()

    def _let_go_unless_open(self) -> None:
        """After a commit or rollback; a commit that failed (SQLite kept the transaction open)
        keeps the gate until its rollback."""
        if self.connection is None or not self.connection.in_transaction:
            self.writer_gate.release()


def _gate_autocommit_writes(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    """A write statement outside a transaction (SQLite's autocommit) holds the gate while it runs."""
    connection: DatabaseWrapper = context["connection"]
    if (connection.in_atomic_block or not connection.autocommit or not connection._gated()
            or not sql.lstrip()[:7].upper().startswith(_WRITES)):
        return execute(sql, params, many, context)
    connection._take_gate()
    try:
        return execute(sql, params, many, context)
    finally:
        connection.writer_gate.release()

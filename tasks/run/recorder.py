"""The step recorder: every write a worker makes, bound to its run's lease token.

Each write opens a transaction, takes the task's row, checks (and extends) the lease with a
conditional update before anything else is written, and commits only then. A worker whose lease
was taken over gets ``LeaseLost`` and writes nothing. On PostgreSQL an event's write is one
statement that does all of that in that order and writes nothing unless the lease holds
(``events.record_numbered_event``): outside a caller's transaction, and while no other
transaction holds the task's row, it is sent alone.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction

from tasks.events import RowHeld, record_numbered_event
from tasks.models import EventKind, Task
from tasks.run import leases as runs
from tasks.vault.facts import Redactor

T = TypeVar("T")
L = TypeVar("L")
Proof = Literal["heartbeat", "locking", "write"]  # what proves a guarded write's lease
log = logging.getLogger(__name__)

# Transient database errors: a restarted or busy database, a terminated connection, a deadlock
# victim. They retry (a write, or the run within its attempts); they never fail a task by themselves.
TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)
RETRY_PAUSE_S = 0.2


def retried_within_lease(attempt: Callable[[], T], *, run_id: int | None = None) -> T:
    """``attempt()``, tried again on a fresh connection after a transient database fault, for up
    to a lease (``BOX_LEASE_SECONDS``): a short fault costs a moment, not the run. Past a lease
    the run's lease is gone anyway, and the fault goes up; at once when an enclosing transaction
    was lost with it. ``run_id``: the run the attempt writes for, named in the log."""
    deadline = time.monotonic() + settings.BOX_LEASE_SECONDS
    while True:
        try:
            return attempt()
        except TRANSIENT_DB_ERRORS as exc:
            if connection.in_atomic_block or time.monotonic() > deadline:
                raise  # an enclosing transaction is lost with it; or the fault outlasted the lease
            if run_id is not None:
                log.warning("run %s: a database fault (%s); trying again", run_id, first_line(exc))
            connection.close()
            time.sleep(RETRY_PAUSE_S)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, for a log line."""
    return (str(exc).strip().splitlines() or [""])[0][:200]


class Counts(NamedTuple):
    """An action a step's event counts first (``StepRecorder.event``): the counter in the task's
    ``spent``, and the name of the limit it must stay within (None: counted, never refused)."""

    counter: str
    limit: str | None


ACTIONS = Counts("actions", "max_actions")  # an acting step, within ``max_actions``


class LeaseLost(Exception):
    """The run's lease is gone: the task was cancelled, or the run was presumed dead."""


class LimitReached(Exception):
    def __init__(self, limit: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.message = message
        self.hint = hint


class _RowChanged(Exception):
    """The task's row is not as this run last wrote it (or the limit looks reached there): the
    action is counted again from the locked row."""


@dataclass(frozen=True)
class _Event:
    """An event to record, and the task row's fields written with it."""

    kind: str
    summary: str
    data: dict[str, Any] | None
    cost_cents: int
    artifacts: list[Any] | None
    updates: dict[str, Any]


def _nothing(_: object) -> None:
    """A ``_guarded`` write whose work is all in its locking statement."""


class StepRecorder:
    def __init__(self, task: Task, run_id: int, token: str, redactor: Redactor) -> None:
        self.task = task
        self.run_id = run_id
        self.token = token
        self.redactor = redactor

    def guarded(self, write: Callable[[], T], *, fresh: Task | None = None, write_proves_lease: bool = False) -> T:
        """Run ``write`` in a transaction that first proves this run still holds its lease.
        ``fresh``: that task is read again in full as the transaction's first statement, its row
        locked by the read (in place of the bare lock), for a write that decides on the task as it
        stands now (the run's finish). ``write_proves_lease``: the first thing ``write`` writes to
        the run is an update conditional on its state and token (the run's close, ``runs.finish``),
        and it raises ``LeaseLost`` when that matched nothing; the heartbeat's update is not sent
        (nothing it wrote before is kept: the transaction is undone).

        A transient database fault (a terminated connection, ``database is locked``) rolls the
        transaction back; it is tried again on a fresh connection for up to a lease, so a short
        fault costs a moment, not the run (a hand-back would run the step in hand again, even
        one that had finished and was only being recorded). Past a lease the run's lease is gone
        anyway, and the fault goes up to the worker, which hands the run back."""
        # The one lock order: the task row before its run rows.
        proof: Proof = "write" if write_proves_lease else "heartbeat"
        if fresh is not None:
            return self._guarded(lambda: runs.read_locked(fresh), lambda _: write(), proof=proof)
        return self._guarded(lambda: runs.lock_task(self.task.pk), lambda _: write(), proof=proof)

    def _guarded(self, locking: Callable[[], L], write: Callable[[L], T], *, proof: Proof = "heartbeat") -> T:
        """``guarded``, with ``locking`` as the transaction's first statement: a write (or a
        locking read) of the task's row, in place of the row lock, so the lease is proven after
        the task row is held (the lock order); undone with the rest if the lease is gone. What it
        returns is handed to ``write``. ``proof``: what proves the lease, ``heartbeat`` (its update,
        right after ``locking``), ``locking`` (which returns something false when it is gone) or
        ``write`` (``guarded``'s ``write_proves_lease``)."""

        def attempt() -> T:
            with transaction.atomic():
                first = locking()
                if proof == "heartbeat":
                    held = runs.holds_lease(self.run_id, self.token)
                else:  # ``write`` raises for itself
                    held = proof == "write" or bool(first)
                if not held:
                    raise LeaseLost(f"run {self.run_id} no longer holds its lease")
                return write(first)

        return self._retried(attempt)

    def _retried(self, attempt: Callable[[], T]) -> T:
        """``attempt()``, tried again after a transient database fault (``guarded``)."""
        return retried_within_lease(attempt, run_id=self.run_id)

    def event(self, kind: str, summary: str, data: dict[str, Any] | None = None, *, cost_cents: int = 0,
              artifacts: list[Any] | None = None, doing_now: bool = False, progress: float | None = None,
              resume: dict[str, Any] | None = None, records: dict[str, Any] | None = None,
              counts: Counts | None = None) -> None:
        """Record an event; with ``resume``/``records``, save progress in the same transaction
        (a step's result and the resume point past it are one write: a run cut off between
        them would otherwise run a step again whose result the log already shows). ``counts``:
        count one action first, in the same transaction (``count``);
        past the limit nothing is recorded and ``LimitReached`` goes up."""

        updates: dict[str, Any] = {}
        if resume is not None:
            updates["resume"] = resume
        if records is not None:
            updates["records"] = records
        if doing_now:
            updates["step"] = self.redactor.text(summary)[:500]
        if progress is not None:
            updates["progress"] = max(0.0, min(1.0, progress))
        event = _Event(kind, summary, data, cost_cents, artifacts, updates)
        if connection.vendor == "postgresql" and not connection.in_atomic_block:
            self._write_alone(event, counts)
        else:
            self._write_in_transaction(event, counts)
        if resume is not None:
            self.task.resume = resume
        if records is not None:
            self.task.records = records

    def _write_alone(self, event: _Event, counts: Counts | None) -> None:
        """PostgreSQL, outside a caller's transaction: the event's write is one statement that
        writes nothing unless the lease holds, so it is sent without a transaction around it (a
        BEGIN and a COMMIT would make one round trip three), as long as the task's row is free; else
        it is written in a transaction, which waits for the row. An action counted from the row
        as this run last wrote it, when the row changed since, is counted again from the row."""
        try:
            if counts is None:
                held = self._retried(lambda: self._record(event, alone=True))
            else:
                held = self._retried(lambda: self._record_counted_as_last_written(event, counts, alone=True))
        except RowHeld:
            self._write_in_transaction(event, counts)
        except _RowChanged:
            assert counts is not None
            self._guarded(lambda: self._record_counted_from_locked_row(event, counts), _nothing, proof="locking")
        else:
            if not held:
                raise LeaseLost(f"run {self.run_id} no longer holds its lease")

    def _write_in_transaction(self, event: _Event, counts: Counts | None) -> None:
        """The event's write in a transaction that takes the task's row first (``_guarded``)."""
        self._guarded(lambda: self._record_locked(event, counts), _nothing, proof="locking")

    def _record_locked(self, event: _Event, counts: Counts | None) -> bool:
        """Inside the transaction: the write, the action counted first when ``counts``; whether
        the lease held. PostgreSQL counts from the row as this run last wrote it when it still
        is so (no locked read first)."""
        if counts is None:
            return self._record(event)
        if connection.vendor == "postgresql":
            try:
                return self._record_counted_as_last_written(event, counts)
            except _RowChanged:
                pass
        return self._record_counted_from_locked_row(event, counts)

    def _record_counted_as_last_written(self, event: _Event, counts: Counts, *,
                                        alone: bool = False) -> bool:
        """PostgreSQL: the action counted from the row as this run last wrote it, written only if
        it is still so (no other writer of ``spent`` or ``limits`` came between); whether the
        lease held. ``_RowChanged`` when it is not so, or the limit looks reached: nothing was
        written, and the caller counts from the locked row."""
        seen = {"spent": self.task.spent, "limits": self.task.limits}
        spent = self._counted_from(self.task, counts.counter, counts.limit, raising=False)
        if spent is None:
            raise _RowChanged
        try:
            held = self._record(event, {"spent": spent}, seen, alone=alone)
        except Task.DoesNotExist:
            raise _RowChanged from None
        self.task.spent = spent
        return held

    def _record_counted_from_locked_row(self, event: _Event, counts: Counts) -> bool:
        """The action counted from the task's row, read locked; whether the lease held."""
        spent = self._counted(counts.counter, counts.limit)
        held = self._record(event, {"spent": spent})
        self.task.spent = spent
        return held

    def _record(self, event: _Event, also: dict[str, Any] | None = None, seen: dict[str, Any] | None = None, *,
                alone: bool = False) -> bool:
        """The task row's write (the event's updates, and ``also``) and the event at the number
        it takes, the lease proven once the row is held: one statement on PostgreSQL
        (``record_numbered_event``). Whether the lease held."""
        values = event.updates if also is None else {**event.updates, **also}
        return record_numbered_event(self.task, values, event.kind, event.summary, event.data, cost_cents=event.cost_cents,
                                     artifacts=event.artifacts, redactor=self.redactor, lease=(self.run_id, self.token),
                                     seen=seen, alone=alone) is not None

    def step(self, summary: str, data: dict[str, Any] | None = None, *, progress: float | None = None,
             counts: Counts | None = None) -> None:
        self.event(EventKind.STEP, summary, data, doing_now=True, progress=progress, counts=counts)

    def note(self, summary: str, data: dict[str, Any] | None = None) -> None:
        self.event(EventKind.NOTE, summary, data)

    def error(self, summary: str, data: dict[str, Any] | None = None) -> None:
        self.event(EventKind.ERROR, summary, data)

    def output(self, summary: str, data: dict[str, Any] | None = None) -> None:
        self.event(EventKind.OUTPUT, summary, data)

    def save_progress(self, *, resume: dict[str, Any] | None = None, records: dict[str, Any] | None = None) -> None:
        """Persist where a retry should pick up and what steps saved so far."""

        def write() -> None:
            updates: dict[str, Any] = {}
            if resume is not None:
                updates["resume"] = resume
                self.task.resume = resume
            if records is not None:
                updates["records"] = records
                self.task.records = records
            Task.objects.filter(pk=self.task.pk).update(**updates)

        self.guarded(write)

    def count(self, counter: str, limit_name: str | None, amount: int = 1) -> None:
        """Count an action, model call or plan in ``spent``, against the task's limit when it has
        one (``limit_name``); ``LimitReached`` past it."""
        self.guarded(lambda: self._count(counter, limit_name, amount))

    def _count(self, counter: str, limit_name: str | None, amount: int = 1) -> None:
        """``count``'s write, inside a lease-checked transaction."""
        spent = self._counted(counter, limit_name, amount)
        Task.objects.filter(pk=self.task.pk).update(spent=spent)
        self.task.spent = spent

    def _counted(self, counter: str, limit_name: str | None, amount: int = 1) -> dict[str, Any]:
        """``spent`` with the action counted, for the caller to write; ``LimitReached`` past the limit."""
        task = Task.objects.select_for_update().only("spent", "limits").get(pk=self.task.pk)  # read-modify-write of spent
        self.task.limits = task.limits  # as the row is now: the next step's write is checked against it (``event``)
        spent = self._counted_from(task, counter, limit_name, amount)
        assert spent is not None
        return spent

    @staticmethod
    def _counted_from(task: Task, counter: str, limit_name: str | None, amount: int = 1, *,
                      raising: bool = True) -> dict[str, Any] | None:
        """``task.spent`` with the action counted; past the limit ``LimitReached``, or None when not ``raising``."""
        spent = dict(task.spent)
        limit = task.limit(limit_name) if limit_name else None
        if limit_name and limit is not None and spent.get(counter, 0) + amount > limit:
            if not raising:
                return None
            raise LimitReached(
                limit_name,
                f"the task used all of its {limit_name} ({limit})",
                f"raise limits.{limit_name} above {limit} and retry the task",
            )
        spent[counter] = spent.get(counter, 0) + amount
        return spent

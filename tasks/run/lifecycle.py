"""What a task holds while it runs, set up before its first step and released when it ends.

``prepare`` gives a run its working directory; ``release`` frees everything a task held, in the
order docs/internals/task-lifecycle.md#states gives ("When a task ends"). Both are idempotent: ``release``
runs after every final move and again when the box starts, for tasks a crash left behind.

The release after a final move is not on the path of whoever made the move: ``release_soon``
hands it to the process's **janitor**, a background thread, so a worker takes its next run at
once. Nothing waits on the janitor for correctness: a task that stacks an ended task's layer
stops and seals that task itself first if the janitor has not yet (``tasks.layers.seal_layer``;
the janitor seals before the slow rest of a release, so a dependent rarely waits at all), a
user goes back to the pool only after its release scrubbed it (``tasks.sandbox.cleanup``), and
what a process leaves undone when it dies is finished by start-up reconcile. The janitor also
refills the pool of task users after a claim took one.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from django.db import connection

from boxsite.core.background import Background, close_if_broken
from tasks import layers, sandbox, sql
from tasks.models import Layer, Task
from tasks.sandbox import users
from tasks.states import ACTIVE, FINAL

if TYPE_CHECKING:
    from tasks.run.handover import Handover

log = logging.getLogger(__name__)

# A release with a failed step (a mount still busy, a process not yet gone) is run again after
# each of these pauses before it is left to start-up reconcile: a pool user stays claimed, and a
# layer unsealed, only if every try failed.
RELEASE_RETRY_S = (0.5, 2.0)


Then = Callable[[], None] | None  # what to do once a release is complete
Held = list[tuple[str, Then]]  # releases a ``Handover`` kept: (task id, then)


class Janitor:
    """One background thread per process (``boxsite.core.background``): releases ended tasks and
    refills the user pool; once it has been quiet long enough, trims the pool's surplus."""

    def __init__(self) -> None:
        self._trimmed = True  # the pool's surplus users go once it is quiet after some work
        self._thread = Background("box-janitor", quiet_wait=self._quiet_wait, on_quiet=self._trim)

    def submit(self, task_id: str, then: Then = None) -> None:
        """Release ``task_id``, then call ``then`` (whatever waited for the release)."""
        self._thread.submit(lambda: self._run(task_id, then))

    def refill(self) -> None:
        """Make free pool users up to ``BOX_USER_POOL``."""
        self._thread.submit(self._refill)

    def _run(self, task_id: str, then: Then) -> None:
        self._trimmed = not sandbox.available()
        try:
            self._release(task_id)
            if then is not None:
                then()  # whatever waited for this release to be complete
            if sandbox.available() and users.refill_wanted():
                users.fill_pool()
        except Exception:  # noqa: BLE001 - the janitor outlives one failure; reconcile retries
            log.exception("the release of task %s failed; start-up reconcile will try again", task_id)

    def _refill(self) -> None:
        self._trimmed = not sandbox.available()
        if not sandbox.available():
            return
        try:
            users.fill_pool()
        except Exception:  # noqa: BLE001 - the janitor outlives one failure; the next claim refills
            log.exception("refilling the pool of task users failed; the next claim tries again")

    def _quiet_wait(self) -> float | None:
        return None if self._trimmed else users.TRIM_IDLE_S

    def _trim(self) -> None:
        """Idle: delete the pool's surplus users if it has been quiet long enough (another
        process may still be claiming)."""
        try:
            if users.quiet_for() < users.TRIM_IDLE_S:
                return
            users.trim_pool()
            self._trimmed = True
        except Exception:  # noqa: BLE001 - the surplus stays until the next quiet spell; the box's stop removes it
            log.exception("trimming the pool of task users failed")
            self._trimmed = True
        finally:
            connection.close()

    @staticmethod
    def _release(task_id: str) -> None:
        if release(task_id):
            return
        for pause in RELEASE_RETRY_S:
            time.sleep(pause)
            close_if_broken()  # the step may have failed on a connection the database dropped
            if release(task_id):
                log.info("the release of task %s completed when tried again", task_id)
                return

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every release and seal this process asked for is done, and both threads
        have let go of their database connections (False at the timeout): a release waits for
        its layer's seal (``tasks.layers.sealer``)."""
        return layers.sealer.drain(timeout) and self._thread.drain(timeout)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every release this process asked for is done (``Background.wait_idle``)."""
        return self._thread.wait_idle(timeout)


janitor = Janitor()


def release_soon(task_id: str, *, then: Then = None, handover: Handover | None = None) -> None:
    """After a final move commits: the janitor releases the task (see the module's docstring),
    then calls ``then`` (also when a release step failed: ``release`` logged it). Given a finish's
    ``handover`` that keeps releases, the release waits there for the worker's ``submit_held``."""
    if handover is not None and handover.keeps(task_id, then):
        return
    janitor.submit(task_id, then)


def submit_held(held: Held) -> None:
    """Hand the releases a ``Handover`` kept to the janitor; the list is emptied (a second call
    does nothing)."""
    while held:
        task_id, then = held.pop(0)
        janitor.submit(task_id, then)


def refill_soon() -> None:
    """The janitor makes free pool users up to ``BOX_USER_POOL`` (a box's start, after a claim)."""
    janitor.refill()


@contextmanager
def _holding(task_id: str) -> Iterator[None]:
    """One of ``prepare`` and ``release`` of a task at a time, across the box's processes. A
    retried task (failed, then queued again) may start its next run while the janitor still
    releases its failure: the run's ``prepare`` waits for that release to finish, and a release
    that comes later finds the task active and leaves it alone."""
    fd = os.open(layers.paths.lock_file("lifecycle", task_id), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def prepare(task: Task) -> Path:
    with _holding(task.pk):
        sandbox.prepare(task.pk)  # the task's user first: the view is made for it
        if sandbox.available() and users.refill_wanted():
            refill_soon()  # the claim took a free user: make the next one off this path
        return layers.open_view(task)


def release(task_id: str) -> bool:
    """Run every release step, each even when one before it failed. False if any failed: the
    failure is logged with its reason, and start-up reconcile tries again. A task that is
    active again (retried after its failure) is left alone: its next run uses what it holds."""
    with _holding(task_id):
        # The task with its layer, read once for the whole release (a task without a layer, which
        # never opened a view, is read again by the layers' step).
        rows = layers.rows_of(task_id)
        task = rows[0]
        state = task.state if task is not None else sql.task_state(task_id)
        if state in ACTIVE:
            log.info("task %s is active again; its release is skipped", task_id)
            return True
        return _release_steps(task_id, rows if task is not None else None)


def _release_steps(task_id: str, rows: tuple[Task | None, Layer | None] | None = None) -> bool:
    ok = True
    # processes gone and files handed back; then mounts, and the layer seals and joins, stays
    # apart, or goes (a dependent waits for the seal); then the rest: keyrings, broker socket, user
    steps: tuple[tuple[str, Callable[[], None]], ...] = (
        ("sandbox", lambda: sandbox.stop(task_id)), ("layers", lambda: layers.release(task_id, stopped=ok, rows=rows)),
        ("sandbox", lambda: sandbox.release(task_id, stopped=ok)))  # ok: the stop (and all before) completed
    for name, step in steps:
        try:
            step()
        except Exception:  # noqa: BLE001 - the next step must still run; reconcile retries this one
            log.exception("releasing the %s of task %s failed; it is tried again (the janitor, start-up reconcile)", name, task_id)
            ok = False
    return ok


def release_ended() -> None:
    """Release every ended (or unknown) task that still holds something on this machine: what
    a crash left behind, or a janitor whose process was stopped before it got to it."""

    for name, step in (("sandbox", sandbox.reconcile), ("layers", layers.reconcile)):
        # users and runtime dirs of ended or unknown tasks; mounts whose task is no longer active
        try:
            step()
        except Exception:  # noqa: BLE001 - one leftover must not keep the others held
            log.exception("releasing %s leftovers failed; the next start tries again", name)

    root = layers.paths.views_root()  # this machine's views
    if root.is_dir():
        ended = set(Task.objects.filter(state__in=FINAL).values_list("pk", flat=True))
        for entry in root.iterdir():
            if entry.name in ended:
                release(entry.name)
    try:
        layers.write_due_notes()  # after the releases: a release seals its layer first
    except Exception:  # noqa: BLE001 - the notes stay due; the next start tries again
        log.exception("writing the override notes a crash left due failed; the next start tries again")


def reconcile() -> None:
    """At start-up: release every ended task whose resources a crash may have left behind."""
    release_ended()
    refill_soon()  # free task users ready before the first task asks
    if sandbox.available():
        layers.disk.warm()  # and spare disk images


def release_host() -> None:
    """When the box stops, after its processes have: leave nothing on the host. Ended or unknown
    tasks are released (finishing a release the stop cut short); active tasks give up their
    processes, user and mounts, which their next run makes again."""

    for name, step in (("sandbox", sandbox.reconcile), ("layers", layers.reconcile)):
        try:
            step()
        except Exception:  # noqa: BLE001 - release the rest; the next start tries again
            log.exception("releasing %s leftovers at stop failed; the next start tries again", name)
    active = list(Task.objects.filter(state__in=ACTIVE).values_list("pk", flat=True))
    for task_id in active:
        try:
            sandbox.release(task_id)
        except Exception:  # noqa: BLE001 - as above
            log.exception("releasing the sandbox of active task %s at stop failed", task_id)
    layers.unmount_views(active)
    empty_spare_pool()  # also any user given back to it since


def empty_spare_pool() -> None:
    """When the box stops: delete the pool's free task users (the box leaves no account behind).
    Safe while other processes still give users back or make new ones: those stay for the next
    call, and the stop makes one after its processes are gone."""
    if sandbox.available():
        try:
            # A process killed while it made a pool user leaves that user claimed as "filling"
            # by a pid that is gone: the claim is dropped first, so the user goes too.
            users.drop_stale_claims()
            users.empty_pool()
            users.remove_orphan_groups()
        except Exception:  # noqa: BLE001 - the next start tries again
            log.exception("removing the pool of task users at stop failed; the next start tries again")

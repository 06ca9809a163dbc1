"""Every state change of a task. Views and jobs call these; nothing else writes ``Task.state``."""
from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from boxsite.core import reads
from boxsite.core.db import may_run_again
from boxsite.core.errors import Conflict, NotFound, TooManyTasks
from boxsite.core.principal import Principal, Via
from boxsite.models import BoxSettings
from tasks import dependencies, layers, notify, pauses, sql
from tasks.events import MAX_SUMMARY, publish_event, record_event
from tasks.models import Condition, Dependency, EventKind, Run, RunKind, RunState, Task
from tasks.run import leases as runs
from tasks.run import lifecycle
from tasks.spec.task import TaskSpec, parse_spec
from tasks.states import ACTIVE, FINAL, State, can_move, can_move_review
from tasks.vault.facts import Redactor, redactor_for, seal_facts

if TYPE_CHECKING:
    from tasks.run.handover import Handover

log = logging.getLogger(__name__)


def get_task_for(principal: Principal, task_id: str, *, for_update: bool = False) -> Task:
    """The task if ``principal`` may see it, else ``NotFound`` (never reveal another's task)."""
    try:  # by its key: get() asks for no ordering (first() would sort by id)
        if for_update:
            return Task.objects.reachable_by(principal).select_for_update().get(pk=task_id)
        if principal.via in (Via.DEVICE, Via.TASK):
            return Task.objects.reachable_by(principal).get(pk=task_id)
    except Task.DoesNotExist:
        raise NotFound(f"no task '{task_id}'") from None
    task = sql.owned_task(task_id, principal.user.pk)  # the owner's own callers reach every task of theirs
    if task is None:
        raise NotFound(f"no task '{task_id}'")
    return task


def _write_task(task: Task, kind: str, summary: str, data: dict[str, Any], *, redactor: Redactor | None = None,
                **fields: Any) -> None:
    """The one write that changes where a task stands: state moves, version bumps, review moves.

    A conditional update on the (state, version) the caller saw: 0 rows means someone else moved
    first, and the caller gets ``Conflict``, never an overwrite. Writes ``fields``, bumps
    ``version``, updates ``task`` in memory and appends one event (published after commit).
    A ``review`` in ``fields`` must be an allowed review move (``tasks.states.REVIEW_MOVES``).
    """
    _check_review(task, fields)
    if not _try_write_task(task, kind, summary, data, redactor=redactor, **fields):
        raise _moved_on(task)


def _check_review(task: Task, fields: dict[str, Any]) -> None:
    if "review" in fields and fields["review"] != task.review and not can_move_review(task.review, fields["review"]):
        raise Conflict(f"a task with review '{task.review or 'none'}' cannot become '{fields['review']}'",
                       field="review", state=task.state)


Note = tuple[str, dict[str, Any]]  # a note recorded right after a move's own event: summary, data


def _try_write_task(task: Task, kind: str, summary: str, data: dict[str, Any], *, redactor: Redactor | None,
                    notes: Sequence[Note] = (), **fields: Any) -> bool:
    """``_write_task`` without the raise: False when the task moved on, and nothing was written.
    ``notes`` are logged right after the change's event, numbered by the same update
    (``sql.move_task``); the events are redacted, and published after commit in the order of
    their numbers. ``fields``: plain values of the task's own columns.

    No savepoint of its own: a refused move writes nothing, so it never has to be undone apart
    from its caller's transaction; any other error undoes the caller's transaction with it."""
    now = timezone.now()
    redact = redactor or redactor_for(task)
    recorded = [(kind, summary, {**data, "version": task.version + 1}),
                *((EventKind.NOTE, note, note_data) for note, note_data in notes)]
    rows = [{"task": task.pk, "kind": event_kind, "summary": redact.text(text)[:MAX_SUMMARY], "data": redact.redact(event_data),
             "cost_cents": 0, "artifacts": [], "created_at": now} for event_kind, text, event_data in recorded]
    with transaction.atomic(savepoint=False):
        moved = sql.move_task(task.pk, task.state, task.version, fields, now, rows)
    if moved is None:
        return False
    task.version += 1
    task.updated_at = now
    for key, value in fields.items():
        setattr(task, key, value)
    task.event_seq = moved.last
    owner_id = task.owner_id
    numbers = range(moved.last - len(rows) + 1, moved.last + 1)
    for number, event_id, (event_kind, _, _) in zip(numbers, moved.ids, recorded, strict=True):
        transaction.on_commit(functools.partial(publish_event, task.pk, owner_id, event_id, number, event_kind))
    return True


def _moved_on(task: Task) -> Conflict:
    current = Task.objects.filter(pk=task.pk).values_list("state", flat=True).first()
    return Conflict(f"the task moved on (it is {current or 'gone'}); reload and try again",
                    field="version", state=current)


def transition(
    task: Task,
    new_state: str,
    *,
    summary: str | None = None,
    data: dict[str, Any] | None = None,
    wake: bool = True,
    redactor: Redactor | None = None,
    notes: Sequence[Note] = (),
    handover: Handover | None = None,
    **fields: Any,
) -> Task:
    """Move ``task`` to ``new_state`` if it is still where the caller saw it (``_write_task``).
    ``notes``: logged right after the move's event, numbered by its update (the start's isolation).

    The move must be in the table (``tasks.states.ALLOWED``). Appends a ``status`` event and runs
    the final-state cleanup when the task ends, which starts or fails the tasks waiting on it
    (``wake=False``: the caller wakes them later in its transaction, ``verbs.cancel_task``).
    ``handover``: inside a finish, the runs the move makes due and the releases it asks for are
    the finish's (``tasks.run.handover``).

    Lock order, everywhere: the task row first, then its run rows. This update takes the task
    row before the final-state cleanup closes the runs; a worker's lease-guarded writes, the
    reaper and hand-backs lock the task row (``runs.lock_task``) before touching a run.
    """
    old_state = task.state
    if not can_move(old_state, new_state):
        raise Conflict(f"a {old_state} task cannot become {new_state}", field="state", state=old_state)
    now = timezone.now()
    fields.setdefault("waiting_for", "")
    if new_state != State.WAITING:
        fields["waiting_for"] = ""
        fields.setdefault("pause", {})
    if new_state == State.RUNNING and task.started_at is None:
        fields["started_at"] = now
    if new_state in FINAL and old_state not in FINAL:
        fields["finished_at"] = now
    if old_state in FINAL and new_state in ACTIVE:  # a retry: live again, with no error of its own
        fields.update(finished_at=None, error="", recoverable=None, hint="")
    if new_state in FINAL:
        fields.setdefault("step", "")  # nothing is being done any more: "Doing now" must not say otherwise
    if new_state == State.UNDONE:
        fields.setdefault("progress", 0.0)  # its changes are gone
    detail: dict[str, Any] = {"from": old_state, "to": new_state}
    if fields["waiting_for"]:
        detail["waiting_for"] = fields["waiting_for"]
    detail.update(data or {})
    summary = summary or _status_summary(new_state, fields["waiting_for"], fields.get("error", task.error))
    _check_review(task, fields)
    # No savepoint: a refused move writes nothing and raises after the block (``_try_write_task``).
    with transaction.atomic(savepoint=False):
        moved = _try_write_task(task, EventKind.STATUS, summary, detail, redactor=redactor, notes=notes,
                                state=new_state, **fields)
        if moved:
            _after_move(task, old_state, new_state, wake=wake, handover=handover)
            notify.queue_move(task)  # after commit, off this thread: a slow service never holds a move
    if not moved:
        raise _moved_on(task)
    return task


def _after_move(task: Task, old_state: str, new_state: str, *, wake: bool, handover: Handover | None) -> None:
    """What a move brings with it, in its transaction: the layer's move, the blockers and runs a
    final move closes, the dependents it wakes, and the release after commit."""
    readers = False
    if new_state in FINAL:
        layers.on_final_move(task, new_state)  # the layer joins, stays apart or leaves, in this transaction
    elif old_state in FINAL:
        layers.on_retry(task)  # the layer is the task's again; its next run reopens its files
    if new_state in FINAL and old_state in ACTIVE:
        _close_blockers(task)
        # Dependents start (or fail) in this transaction: their first run is committed with
        # the move that allows it and sent after commit. Those whose artifact edge reads this
        # task's layer wait for its release, which seals the layer.
        # ``wake=False``: the caller wakes them later; the readers are looked for after the release.
        readers = wake_dependents(task.pk, handover=handover) if wake else True
    if new_state in FINAL:
        task_id = task.pk  # also after done -> undone: the layer's files go, the view is rebuilt
        wake_readers = old_state in ACTIVE and readers
        transaction.on_commit(lambda: release_task(task_id, wake_readers=wake_readers, handover=handover))


def bump_version(task: Task, kind: str, summary: str, data: dict[str, Any], *, redactor: Redactor | None = None,
                 **fields: Any) -> None:
    """Not a move: the task stays where it is, its version goes up (an answer, a decision) and
    ``fields`` are written with it. ``Conflict`` when the task moved meanwhile."""
    _write_task(task, kind, summary, data, redactor=redactor, **fields)


def _status_summary(state: str, waiting_for: str, error: str) -> str:
    if state == State.WAITING:
        return f"waiting for {waiting_for}"
    if state == State.FAILED and error:
        return f"failed: {error}"
    return state


def _close_blockers(task: Task) -> None:
    """A task that ends closes its blockers (``approvals.blockers``) and its open runs."""
    pauses.blockers().close_for_final_move(task)
    runs.cancel_open_runs(task)


def release_task(task_id: str, *, wake_readers: bool = False, handover: Handover | None = None) -> None:
    """After a task ended: free what it held (processes, sockets, mounts, its user), in the
    background (``lifecycle.release_soon``, or kept by a finish's ``handover``); ``wake_readers``:
    then wake the dependents whose artifact edge reads its layer, which the release has sealed."""

    def wake_readers_now() -> None:
        wake_dependents(task_id, after_release=True)

    lifecycle.release_soon(task_id, then=wake_readers_now if wake_readers else None, handover=handover)


# --- dependencies (tasks.dependencies holds the edges; the moves are here) ----------------------

def wake_dependents(task_id: str, *, after_release: bool = False, handover: Handover | None = None) -> bool:
    """``task_id`` ended: start, or fail, each task that waited on it. Called inside the
    transaction of the final move for those that do not read its layer (each in a savepoint of
    its own, so one that cannot be woken never undoes the move), and ``after_release`` for those
    whose artifact edge reads it. Best effort: the scheduler's sweep (``release_waiting``) repairs
    a wake-up lost to a crash or a failure here. True when, at the move, some read its layer:
    only then are they looked for again after the release (one lookup for a task without them).
    ``handover``: the move is a finish's, which holds the runs made due (``tasks.run.handover``)."""
    found = dependencies.dependents_of(task_id, only_reading=after_release)
    readers = any(condition == Condition.ARTIFACT for _, condition in found)
    waking = {dependent for dependent, condition in found if after_release or condition != Condition.ARTIFACT}
    for dependent in sorted(waking):
        try:
            release_if_ready(dependent, if_free=not after_release, handover=handover)
        except Exception:  # noqa: BLE001 - the savepoint is rolled back; the sweep retries
            log.exception("waking task %s after its dependency %s ended failed; the scheduler retries", dependent, task_id)
    return readers


def _release_logged(task_id: str, handover: Handover | None) -> None:
    try:
        release_if_ready(task_id, handover=handover)
    except Exception:  # noqa: BLE001 - after commit: the sweep retries
        log.exception("starting task %s after its dependency ended failed; the scheduler retries", task_id)


def held_back() -> list[str]:
    """Queued tasks with no open run and a dependency that has ended: those whose edges may now
    let them start (or fail them). One whose every dependency is still active is waiting for
    sure, and is passed over without the decision's transaction (on SQLite, the one write lock:
    a sweep during a long chain took it for every link still to come)."""
    return list(Task.objects.filter(state=State.QUEUED, dependency_edges__on__state__in=FINAL)
                .exclude(runs__state__in=[RunState.QUEUED, RunState.RUNNING])
                .values_list("pk", flat=True).distinct())


def release_waiting() -> int:
    """The scheduler's sweep: every held-back task whose edges now allow it starts (or fails).
    A duplicate wake-up finds the task's first run already queued and does nothing."""
    return sum(1 for task_id in held_back() if release_if_ready(task_id))


class _RecoveryNeedsLocks(Exception):
    """A recovery review creates a task: that takes the settings row's lock first (as every
    creation does), so the decision is taken again with it."""


class _Busy(Exception):
    """Inside a dependency's final move: a lock the decision needs is held by another
    transaction, which is not waited for there."""


def release_if_ready(task_id: str, *, if_free: bool = False, handover: Handover | None = None) -> bool:
    """Queue the first run of a held-back task whose edges are all resolved, or fail it when a
    required edge can never be satisfied (or open its recovery review). True when it moved.

    ``if_free`` (inside a dependency's final move, which holds that task's row): no lock is
    waited for there, since whoever holds it may be waiting for the dependency's row (a cancel
    locks a parent, then its children; an edge writer holds the owner's lock), and no recovery
    review is opened there (it takes the settings row's lock first). The decision is then taken
    again right after the move commits. ``handover``: see ``wake_dependents``."""
    try:
        return _release_if_ready(task_id, creating=False, if_free=if_free, handover=handover)
    except (_RecoveryNeedsLocks, _Busy) as why:
        if if_free:
            transaction.on_commit(lambda: _release_logged(task_id, handover))
            return False
        if isinstance(why, _Busy):  # pragma: no cover - only ``if_free`` skips locks
            raise
        return _release_if_ready(task_id, creating=True, if_free=False, handover=handover)


def _release_if_ready(task_id: str, *, creating: bool, if_free: bool, handover: Handover | None) -> bool:
    skip = if_free and connection.features.has_select_for_update_skip_locked
    with transaction.atomic():
        if creating:
            BoxSettings.objects.select_for_update().get_or_create(pk=1)
        task = _held_if_queued(task_id, skip=skip)
        if task is None:
            return False
        found = dependencies.verdict(task)
        if found.started:  # a run is queued or running already: a duplicate wake-up
            return False
        if found.failure and found.edge is not None and dependencies.recovery_due(found.edge):
            if not creating:
                raise _RecoveryNeedsLocks
            runs.read_locked(task)  # the whole row, for the review (its lock is held)
            return open_recovery_review(task, found.edge)
        if found.failure:
            runs.read_locked(task)  # the whole row, for the move
            fail_task(task, f"cannot start: {found.failure}", recoverable=False, handover=handover)
            return True
        if not found.ready:
            return False
        _release(task, handover)
        return True


def _release(task: Task, handover: Handover | None) -> None:
    """A held-back task may start: its note and its first run, a ``start`` due now and written
    as sent (``sql.release_held``); the run is sent and the note published after commit. Call
    inside the transaction that holds the task's row and decided it."""
    now, redact = timezone.now(), redactor_for(task)
    note = {"task": task.pk, "kind": EventKind.NOTE, "summary": redact.text("its dependencies allow it to start")[:MAX_SUMMARY],
            "data": redact.redact({"dependencies": "satisfied"}), "cost_cents": 0, "artifacts": [], "created_at": now}
    run = Run(task_id=task.pk, number=0, kind=RunKind.START, resume={}, available_at=now, enqueued_at=now)
    released = sql.release_held(task.pk, note, run)
    task.event_seq = released.seq
    transaction.on_commit(functools.partial(publish_event, task.pk, task.owner_id, released.event_id, released.seq, EventKind.NOTE))
    runs.send_after_commit(released.run_id, handover)


def _held_if_queued(task_id: str, *, skip: bool) -> Task | None:
    """The task if it is queued, its owner's row and then its own locked for the rest of the
    transaction (the lock order of every edge writer: a recovery review adds an edge, and two
    sweeps deciding one task take turns). Only what the decision and its note read is loaded
    when no lock is waited for (``dependencies.held_queued``); the rest is read when first used.

    ``skip``: no lock is waited for (``_Busy`` when one is held), and both are taken by one
    statement, whose order of the two closes no cycle since it waits for neither. SQLite has no
    row locks (its transaction holds the one write lock): one read too."""
    if skip or not connection.features.has_select_for_update:
        task = dependencies.held_queued(task_id, skip_locked=skip)
        if task is None and skip and Task.objects.filter(pk=task_id, state=State.QUEUED).exists():
            raise _Busy
        return task
    # Rows read by key and unordered: ``first()`` would order and slice each query too.
    owner_id = next(iter(Task.objects.filter(pk=task_id).values_list("owner_id", flat=True)), None)
    if owner_id is None:
        return None
    dependencies.lock_owner(owner_id)
    return next(iter(Task.objects.filter(pk=task_id, state=State.QUEUED).select_for_update()), None)


RECOVERY_PROMPT = ("Task {dependent} ({title}) needed task {on} to {needed}, and it did not: {why}. Look at what went "
                   "wrong, fix or redo it if you want, then continue this review (or cancel it): either way task "
                   "{dependent} then decides afresh whether to start, without that dependency.")


def open_recovery_review(task: Task, edge: Dependency) -> bool:
    """Replace ``task``'s failed required edge by one review task (``dependencies.recovery_due``):
    the failed edge stays as non-required history, and a required ``completion`` edge to the
    review holds ``task`` until the review ends (done, failed or cancelled). Call inside the
    transaction that holds the owner's and ``task``'s locks. False (nothing changed) when the
    box is at capacity: the sweep opens it later."""
    on = edge.on
    why = dependencies.verdict_reason(edge)
    needed = "succeed" if edge.condition != "artifact" else f"leave '{edge.artifact}'"
    body = {"title": f"Review: {on.title}"[:200], "hosts": [], "budgetCents": 0,
            "prompt": RECOVERY_PROMPT.format(dependent=task.pk, title=task.title, on=on.pk, needed=needed, why=why),
            "flow": {"steps": [{"checkpoint": {"reason": f"review why task {on.pk} did not {needed}, then continue"}}]}}
    try:
        with transaction.atomic():
            reviewer = create_task(body, Principal.system(task.owner), source=f"recovery:{task.pk}")
    except TooManyTasks:
        log.info("the recovery review of %s waits for capacity", task.pk)
        return False
    Dependency.objects.filter(pk=edge.pk).update(required=False)
    review_edge = dependencies.EdgeSpec(on=reviewer.pk, condition=Condition.COMPLETION, required=True)
    dependencies.add_edge(task, reviewer, review_edge, recovers=edge)
    shown = [{**item, "required": False} if isinstance(item, dict) and item.get("task") == on.pk else
             dependencies.EdgeSpec(on=on.pk, condition=edge.condition, required=False).as_json() if item == on.pk else item
             for item in task.depends_on]
    task.depends_on = [*shown, {**review_edge.as_json(), "recovers": on.pk}]
    Task.objects.filter(pk=task.pk).update(depends_on=task.depends_on)
    record_event(task, EventKind.NOTE, f"dependency {on.pk} did not {needed}; review task {reviewer.pk} decides: "
                 "once it ends, this task decides afresh", {"recovery": {
                     "review": reviewer.pk, "dependency": on.pk, "dependencyVersion": on.version}})
    return True


CREATE_ATTEMPTS = 3


def create_task(body: Any, principal: Principal, *, source: str | None = None) -> Task:
    """The one way tasks are born: API, phone, schedules and triggers all call this.

    A creation with dependencies locks rows other transactions lock too (its dependencies' rows
    through the edges' foreign keys, the owner's, the settings row), and PostgreSQL may pick it as
    a deadlock's victim; on its own (outside a caller's transaction) it is then tried again."""
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            with reads.read_once():  # the settings row once, not once per spec default
                return _create_task(body, principal, source=source)
        except OperationalError as exc:
            if not may_run_again(exc) or attempt == CREATE_ATTEMPTS:
                raise
            log.warning("creating a task was aborted by the database (%s); trying again",
                        getattr(exc.__cause__, "sqlstate", None))
    raise AssertionError("unreachable")


@transaction.atomic
def _create_task(body: Any, principal: Principal, *, source: str | None) -> Task:
    # The settings row is read once, locked (so two creations at the limit cannot both pass), and
    # the spec's defaults come from it; at capacity the answer is 429 before the spec is even read.
    refuse_at_capacity(locked_settings().max_active_tasks)
    spec = parse_spec(body, principal, source=source)
    return _insert_task(spec, principal)


def locked_settings() -> BoxSettings:
    """The settings row, locked until the transaction ends (PostgreSQL; SQLite's write
    transaction holds the whole database), and kept as the operation's read (``boxsite.core.reads``)."""
    row = BoxSettings.locked()
    reads.keep("box_settings", row)
    return row


def refuse_at_capacity(limit: int) -> None:
    """``TooManyTasks`` when ``limit`` tasks are active. A plain-language ask parked for a plan
    holds no worker and may wait for days (until a model is configured): it is counted apart, so
    it never keeps real work from starting."""
    if sql.active_task_count() >= limit:
        raise TooManyTasks(f"{limit} tasks are already queued, running or waiting; finish or cancel one first")


def _insert_task(spec: TaskSpec, principal: Principal) -> Task:
    fields = dict(spec.fields)
    fields["facts"] = seal_facts(fields["facts"], fields["secret_facts"])  # secret values encrypted at rest
    task = Task(owner=principal.user, device=principal.device, review="",
                created_by_task=principal.task, created_by_run=principal.run, **fields)
    task.user = f"box-{task.pk}"  # the id is made before the insert (``new_task_id``)
    if task.folders:
        task.machine = settings.BOX_MACHINE  # several machines: the folders are on this one's disk
    # The log's first number is taken by the insert itself: no other writer can see the row yet,
    # so the ``UPDATE … RETURNING event_seq`` that numbers a later event is not needed here.
    task.event_seq = 1
    task.save(force_insert=True)
    queued: dict[str, Any] = {"to": State.QUEUED, "version": task.version, "source": task.source}
    if principal.task is not None:
        queued["createdBy"] = {"task": principal.task.pk, "run": principal.run}
    record_event(task, EventKind.STATUS, "queued", queued, seq=1)
    edges = dependencies.parse_edges(task.depends_on)
    for edge in edges:
        on = spec.dependencies.get(edge.on) or Task.objects.get(pk=edge.on)  # the spec's check read it
        dependencies.add_edge(task, on, edge, new=True)
    if not edges:
        runs.create_run(task, RunKind.START, first=True)
        return task
    found = dependencies.verdict(task)
    if found.failure:
        return fail_task(task, f"cannot start: {found.failure}", recoverable=False)
    if found.ready:
        runs.create_run(task, RunKind.START, first=True)
    else:
        waiting = list(found.waiting_on)
        record_event(task, EventKind.NOTE, f"waits for {', '.join(waiting)} before it starts", {"waiting_for_tasks": waiting})
    return task


def begin_box_task(principal: Principal, workspace_id: int, *, task_id: str, title: str, prompt: str, worker: str, source: str,
                   data: dict[str, Any]) -> Task:
    """A task the box does itself, inside the caller's transaction, with no run (an upload,
    ``tasks.layers.uploads``): inserted queued and moved to running, so its log reads as any
    task's. Call inside a transaction that ends it (``transition`` to done) before it commits:
    no one else ever sees it active, so no worker, reaper or capacity count has to know it."""
    if not connection.in_atomic_block:
        raise RuntimeError("begin_box_task must run inside the transaction that ends the task")
    task = Task(id=task_id, owner=principal.user, device=principal.device, review="", title=title[:200], prompt=prompt,
                workspace_id=workspace_id, worker=worker, source=source, tools=[], hosts=[], budget_cents=0)
    task.user = f"box-{task.pk}"  # named as any task's; none is ever made for it
    task.event_seq = 1
    task.save(force_insert=True)
    record_event(task, EventKind.STATUS, "queued", {"to": State.QUEUED, "version": task.version, "source": source, **data}, seq=1)
    return transition(task, State.RUNNING, summary="running: written by the box", data=data)


def fail_task(task: Task, error: str, *, recoverable: bool | None = None, hint: str = "",
              redactor: Redactor | None = None, handover: Handover | None = None) -> Task:
    return transition(task, State.FAILED, error=error, recoverable=recoverable, hint=hint, redactor=redactor,
                      handover=handover)


def note(task: Task, summary: str, data: dict[str, Any] | None = None) -> None:
    with transaction.atomic():
        record_event(task, EventKind.NOTE, summary, data)

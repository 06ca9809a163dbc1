"""Every state change of a task. Views and jobs call these; nothing else writes ``Task.state``."""
from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from boxsite.core import reads
from boxsite.core.db.rows import column
from boxsite.core.errors import Conflict, Forbidden, InvalidRequest, NotFound, TooManyTasks
from boxsite.core.principal import Principal
from boxsite.models import BoxSettings
from tasks import dependencies, layers, moves, pauses
from tasks.api.presenters import is_final_view
from tasks.events import numbered_update, record_event
from tasks.layers import review
from tasks.layers.locks import layer_lock
from tasks.layers.paths import show
from tasks.layers.roots import changes_of
from tasks.layers.task_view import seal_layer
from tasks.models import Condition, Dependency, EventKind, Layer, LayerState, Run, RunKind, RunState, Task
from tasks.run import leases as runs
from tasks.run import lifecycle
from tasks.spec.task import RetryBody, TaskSpec, parse_spec
from tasks.states import ACTIVE, FINAL, Review, State, can_move, can_move_review
from tasks.vault.facts import Facts, Redactor, redactor_for, seal_facts

log = logging.getLogger(__name__)


def get_task_for(principal: Principal, task_id: str, *, for_update: bool = False) -> Task:
    """The task if ``principal`` may see it, else ``NotFound`` (never reveal another's task)."""
    try:  # by its key: get() asks for no ordering (first() would sort by id)
        if for_update:
            return Task.objects.reachable_by(principal).select_for_update().get(pk=task_id)
        return Task.objects.reachable_one(principal, task_id)
    except Task.DoesNotExist:
        raise NotFound(f"no task '{task_id}'") from None


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
    ``notes`` are logged right after the change's event, numbered by the same update.

    No savepoint of its own: a refused move writes nothing, so it never has to be undone apart
    from its caller's transaction; any other error undoes the caller's transaction with it."""
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        if moves.can_write(fields):  # statements written once per process (``tasks.moves``)
            recorded = [(kind, summary, {**data, "version": task.version + 1}),
                        *((EventKind.NOTE, note, note_data) for note, note_data in notes)]
            return moves.write(task, now, fields, recorded, redactor=redactor or redactor_for(task))
        # The events' numbers are taken in the same statement (``tasks.events.numbered_update``).
        seq = numbered_update(Task.objects.filter(pk=task.pk, state=task.state, version=task.version),
                              1 + len(notes), version=F("version") + 1, updated_at=now, **fields)
        if seq is None:
            return False
        task.version += 1
        task.updated_at = now
        for key, value in fields.items():
            setattr(task, key, value)
        record_event(task, kind, summary, {**data, "version": task.version}, redactor=redactor, seq=seq)
        for number, (note, note_data) in enumerate(notes, start=seq + 1):
            record_event(task, EventKind.NOTE, note, note_data, redactor=redactor, seq=number)
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
    **fields: Any,
) -> Task:
    """Move ``task`` to ``new_state`` if it is still where the caller saw it (``_write_task``).
    ``notes``: logged right after the move's event, numbered by its update (the start's isolation).

    The move must be in the table (``tasks.states.ALLOWED``). Appends a ``status`` event and runs
    the final-state cleanup when the task ends, which starts or fails the tasks waiting on it
    (``wake=False``: the caller wakes them later in its transaction, ``cancel_task``).

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
            _after_move(task, old_state, new_state, wake=wake)
    if not moved:
        raise _moved_on(task)
    return task


def _after_move(task: Task, old_state: str, new_state: str, *, wake: bool) -> None:
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
        readers = wake_dependents(task.pk) if wake else True
    if new_state in FINAL:
        task_id = task.pk  # also after done -> undone: the layer's files go, the view is rebuilt
        wake_readers = old_state in ACTIVE and readers
        transaction.on_commit(lambda: release_task(task_id, wake_readers=wake_readers))


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


def release_task(task_id: str, *, wake_readers: bool = False) -> None:
    """After a task ended: free what it held (processes, sockets, mounts, its user), in the
    background (``lifecycle.release_soon``); ``wake_readers``: then wake the dependents whose
    artifact edge reads its layer, which the release has sealed."""

    def wake_readers_now() -> None:
        wake_dependents(task_id, after_release=True)

    lifecycle.release_soon(task_id, then=wake_readers_now if wake_readers else None)


# --- dependencies (tasks.dependencies holds the edges; the moves are here) ----------------------

def wake_dependents(task_id: str, *, after_release: bool = False) -> bool:
    """``task_id`` ended: start, or fail, each task that waited on it. Called inside the
    transaction of the final move for those that do not read its layer (each in a savepoint of
    its own, so one that cannot be woken never undoes the move), and ``after_release`` for those
    whose artifact edge reads it. Best effort: the scheduler's sweep (``release_waiting``) repairs
    a wake-up lost to a crash or a failure here. True when, at the move, some read its layer:
    only then are they looked for again after the release (one lookup for a task without them)."""
    found = dependencies.dependents_of(task_id, only_reading=after_release)
    readers = any(condition == Condition.ARTIFACT for _, condition in found)
    waking = {dependent for dependent, condition in found if after_release or condition != Condition.ARTIFACT}
    for dependent in sorted(waking):
        try:
            release_if_ready(dependent, if_free=not after_release)
        except Exception:  # noqa: BLE001 - the savepoint is rolled back; the sweep retries
            log.exception("waking task %s after its dependency %s ended failed; the scheduler retries", dependent, task_id)
    return readers


def _release_logged(task_id: str) -> None:
    try:
        release_if_ready(task_id)
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


def release_if_ready(task_id: str, *, if_free: bool = False) -> bool:
    """Queue the first run of a held-back task whose edges are all resolved, or fail it when a
    required edge can never be satisfied (or open its recovery review). True when it moved.

    ``if_free`` (inside a dependency's final move, which holds that task's row): no lock is
    waited for there, since whoever holds it may be waiting for the dependency's row (a cancel
    locks a parent, then its children; an edge writer holds the owner's lock), and no recovery
    review is opened there (it takes the settings row's lock first). The decision is then taken
    again right after the move commits."""
    try:
        return _release_if_ready(task_id, creating=False, if_free=if_free)
    except (_RecoveryNeedsLocks, _Busy) as why:
        if if_free:
            transaction.on_commit(lambda: _release_logged(task_id))
            return False
        if isinstance(why, _Busy):  # pragma: no cover - only ``if_free`` skips locks
            raise
        return _release_if_ready(task_id, creating=True, if_free=False)


def _release_if_ready(task_id: str, *, creating: bool, if_free: bool) -> bool:
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
            fail_task(task, f"cannot start: {found.failure}", recoverable=False)
            return True
        if not found.ready:
            return False
        moves.release(task, timezone.now(), "its dependencies allow it to start", {"dependencies": "satisfied"},
                      redactor=redactor_for(task))
        return True


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
             {"task": on.pk, "required": False} if item == on.pk else item for item in task.depends_on]
    task.depends_on = [*shown, {**review_edge.as_json(), "recovers": on.pk}]
    Task.objects.filter(pk=task.pk).update(depends_on=task.depends_on)
    record_event(task, EventKind.NOTE, f"dependency {on.pk} did not {needed}; review task {reviewer.pk} decides: "
                 "once it ends, this task decides afresh", {"recovery": {
                     "review": reviewer.pk, "dependency": on.pk, "dependencyVersion": on.version}})
    return True


@transaction.atomic
def add_dependency(principal: Principal, task_id: str, body: Any) -> Task:
    """An edge added after creation: only to a task that has not started (its queued first run
    is held back until the edges allow it)."""
    edges = dependencies.parse_edges([body])
    # The owner's lock before any task row: two requests adding x->y and y->x would otherwise
    # each hold one task row and wait for the other's (the edge's foreign keys lock both).
    dependencies.lock_owner(principal.user.pk)
    task = get_task_for(principal, task_id, for_update=True)
    on = Task.objects.reachable_by(principal).filter(pk=edges[0].on).first()
    if on is None:
        raise InvalidRequest(f"no task '{edges[0].on}'", field="task")
    if task.state != State.QUEUED or task.started_at is not None:
        raise Conflict(f"a {task.state} task has already started; only a queued task can wait for another",
                       field="state", state=task.state)
    dependencies.add_edge(task, on, edges[0])
    Task.objects.filter(pk=task.pk).update(depends_on=[*task.depends_on, edges[0].as_json()])
    task.depends_on = [*task.depends_on, edges[0].as_json()]
    # Hold back its first run unless a worker already took it (then the task is starting: refused).
    held = Run.objects.filter(task=task, state=RunState.QUEUED).update(
        state=RunState.CANCELLED, finished_at=timezone.now(), outcome="held for dependencies")
    if Run.objects.filter(task=task, state=RunState.RUNNING).exists():
        raise Conflict("the task is starting; only a queued task can wait for another", field="state", state=task.state)
    record_event(task, EventKind.NOTE, f"waits for task {on.pk} ({edges[0].condition})",
                 {"dependency": edges[0].as_json(), "held": held})
    transaction.on_commit(lambda: release_if_ready(task.pk))
    return task


# PostgreSQL's answers to a transaction it chose to abort so others could go on (a deadlock, a
# serialisation failure): nothing of it was written, so it may run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})
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
            sqlstate = getattr(exc.__cause__, "sqlstate", None)
            if sqlstate not in RETRYABLE_SQLSTATES or connection.in_atomic_block or attempt == CREATE_ATTEMPTS:
                raise
            log.warning("creating a task was aborted by the database (%s); trying again", sqlstate)
    raise AssertionError("unreachable")


@transaction.atomic
def _create_task(body: Any, principal: Principal, *, source: str | None) -> Task:
    # The settings row is read once, locked (so two creations at the limit cannot both pass), and
    # the spec's defaults come from it; at capacity the answer is 429 before the spec is even read.
    _refuse_at_capacity(_locked_settings().max_active_tasks)
    spec = parse_spec(body, principal, source=source)
    return _insert_task(spec, principal)


def _locked_settings() -> BoxSettings:
    """The settings row, locked until the transaction ends (PostgreSQL; SQLite's write
    transaction holds the whole database), and kept as the operation's read (``boxsite.core.reads``)."""
    row = BoxSettings.locked()
    reads.keep("box_settings", row)
    return row


def _refuse_at_capacity(limit: int) -> None:
    # A plain-language ask parked for a plan holds no worker and may wait for days (until a model
    # is configured): it is counted apart, so it never keeps real work from starting. Asked at
    # every creation: written once per process, where the ORM built the count each time.
    with connection.cursor() as cursor:
        cursor.execute(_active_count_statement(connection.vendor), [*(s.value for s in sorted(ACTIVE)), State.WAITING.value, "plan"])
        (active,) = cursor.fetchone()
    if active >= limit:
        raise TooManyTasks(f"{limit} tasks are already queued, running or waiting; finish or cancel one first")


@functools.cache
def _active_count_statement(vendor: str) -> str:
    quote = connection.ops.quote_name
    state, waiting_for = quote(column(Task, "state")), quote(column(Task, "waiting_for"))
    return (f"SELECT COUNT(*) FROM {quote(Task._meta.db_table)} WHERE {state} IN ({', '.join(['%s'] * len(ACTIVE))}) "
            f"AND NOT ({state} = %s AND {waiting_for} = %s)")


def _insert_task(spec: TaskSpec, principal: Principal) -> Task:
    fields = dict(spec.fields)
    fields["facts"] = seal_facts(fields["facts"], fields["secret_facts"])  # secret values encrypted at rest
    task = Task(owner=principal.user, device=principal.device, review="",
                created_by_task=principal.task, created_by_run=principal.run, **fields)
    task.user = f"box-{task.pk}"  # the id is made before the insert (``new_task_id``)
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


def spec_of(task: Task) -> dict[str, Any]:
    """The spec ``task`` was made from, as ``POST /api/tasks`` takes it (secret facts included,
    in clear: for the box's own use only, never shown)."""
    facts = Facts.of(task)
    spec: dict[str, Any] = {
        "title": task.title, "prompt": task.prompt, "worker": task.worker, "tools": task.tools, "hosts": task.hosts,
        "budgetCents": task.budget_cents, "constraints": task.constraints, "limits": task.limits,
    }
    if task.folders:
        spec["folders"] = task.folders
    else:
        spec["workspace"] = task.workspace.name
    if task.command is not None:
        spec["command"] = task.command
    if task.flow is not None:
        spec["flow"] = task.flow
    if task.criteria is not None:
        spec["criteria"] = task.criteria
    if task.output is not None:
        spec["output"] = task.output
    if facts.values:
        spec["facts"] = facts.values
        spec["secretFacts"] = sorted(facts.secret_names)
    return spec


def rerun_task(principal: Principal, task_id: str, body: Any, *, source: str | None = None) -> Task:
    """A new task from an ended task's spec; ``body`` replaces any of its fields (the portal's
    form, edited). Checked whole, like any new task."""
    if not isinstance(body, dict):
        raise InvalidRequest("a rerun takes a JSON object: the fields to change, or {}")
    task = get_task_for(principal, task_id)
    if not is_final_view(task):
        raise Conflict(f"task '{task.pk}' is {task.state}; only an ended task can run again (cancel it first)")
    return create_task({**spec_of(task), **body}, principal, source=source)


def retry_task(principal: Principal, task_id: str, body: Any) -> Task:
    """Send a recoverably failed task back to the queue, in place: the limits and budget the body
    names raised first (never lowered), its layer reopened, a ``retry`` run resuming from the step
    that failed with what earlier runs saved (``task.resume``, ``task.records``).

    Two retries at once: the conditional update (``_write_task``) lets exactly one through."""
    fields = RetryBody.parse({} if body is None else body)
    task = get_task_for(principal, task_id)
    _refuse_retry(task, fields.get("version"))
    raised = _raised(task, fields)
    # The failure's release (processes, user, mounts, the layer sealed) may still be in the
    # janitor's hands: finish it here, so the retry's run starts from a settled layer. Idempotent.
    lifecycle.release(task.pk)
    with transaction.atomic():
        _refuse_at_capacity(_locked_settings().max_active_tasks)
        updates: dict[str, Any] = {}
        if "limits" in raised:
            updates["limits"] = {**task.limits, **raised["limits"]}
        if "budgetCents" in raised:
            updates["budget_cents"] = raised["budgetCents"]
        shown = [f"limits.{name} to {value}" for name, value in raised.get("limits", {}).items()]
        shown += [f"budgetCents to {raised['budgetCents']}"] if "budgetCents" in raised else []
        summary = f"queued again: retried by the owner ({principal.via})" + (f"; raised {', '.join(shown)}" if shown else "")
        step = int((task.resume or {}).get("step", 0))
        transition(task, State.QUEUED, summary=summary,
                   data={"by": principal.via, "retry": True, "raised": raised, "from_step": step + 1}, **updates)
        runs.create_run(task, RunKind.RETRY, resume=task.resume)
    return task


def _refuse_retry(task: Task, version: int | None) -> None:
    if task.state != State.FAILED:
        raise Conflict(f"a {task.state} task cannot be retried; only a failed task whose failure is recoverable can",
                       field="state", state=task.state)
    if task.recoverable is not True:
        raise Conflict("this failure is not recoverable: retrying would fail the same way; fix the spec and rerun it "
                       "as a new task", field="recoverable", state=task.state)
    if version is not None and version != task.version:
        raise Conflict(f"the task is at version {task.version}, not {version}; reload it and try again",
                       field="version", state=task.state)


def _raised(task: Task, fields: dict[str, Any]) -> dict[str, Any]:
    """The limits and budget the retry raises, each checked against the one in force: lowering
    (or bounding an unbounded limit) is a 400 naming the field."""
    raised: dict[str, Any] = {}
    for name, value in (fields.get("limits") or {}).items():
        now = task.limit(name)
        if now is None:
            raise InvalidRequest(f"'limits.{name}' is unbounded for this task; a retry only raises limits",
                                 field=f"limits.{name}")
        if value < now:
            raise InvalidRequest(f"'limits.{name}' is {now} for this task; a retry only raises limits (at least {now})",
                                 field=f"limits.{name}")
        if value > now:
            raised.setdefault("limits", {})[name] = value
    budget = fields.get("budgetCents")
    if budget is not None and budget < task.budget_cents:
        raise InvalidRequest(f"'budgetCents' is {task.budget_cents} for this task; a retry only raises it "
                             f"(at least {task.budget_cents})", field="budgetCents")
    if budget is not None and budget > task.budget_cents:
        raised["budgetCents"] = budget
    return raised


@transaction.atomic
def cancel_task(principal: Principal, task_id: str) -> Task:
    """Cancel the task and, in the same transaction, every active descendant (its children
    through ``parent``, theirs, ...). Each final move closes that task's runs, approvals and
    questions; after commit each release kills its processes, which aborts a running step.
    Descendants that already ended are left as they are."""
    # Locked, so a worker moving the task at this moment (queued -> running) is waited for, and
    # the cancel applies to the state it left instead of failing on a stale version.
    task = get_task_for(principal, task_id, for_update=True)
    if task.state not in ACTIVE:
        raise Conflict(f"a {task.state} task cannot be cancelled", field="state", state=task.state)
    by = {"by": principal.via}
    # Dependents are woken once every descendant has moved: a descendant that also waits on
    # the task is cancelled with it, not failed for its dependency.
    transition(task, State.CANCELLED, summary=f"cancelled by the owner ({principal.via})", data=by, wake=False)
    ended = [task.pk]
    for descendant in _descendants(task):
        # Top-down, each row locked before it moves (the lock order is always parent first).
        child = Task.objects.select_for_update().get(pk=descendant)
        if child.state in ACTIVE:
            transition(child, State.CANCELLED, summary=f"cancelled with task {task.pk}",
                       data={**by, "with": task.pk}, wake=False)
            ended.append(child.pk)
    for task_id in ended:
        wake_dependents(task_id)
    return task


def _descendants(task: Task) -> list[str]:
    """Every task below ``task`` through ``parent``, parents before their children."""
    found: list[str] = []
    frontier = [task.pk]
    while frontier:
        children = list(Task.objects.filter(parent_id__in=frontier).order_by("created_at", "pk").values_list("pk", flat=True))
        children = [c for c in children if c not in found and c != task.pk]
        found += children
        frontier = children
    return found


def undo_task(principal: Principal, task_id: str) -> Task:
    task = get_task_for(principal, task_id)
    extra: dict[str, Any] = {}
    if task.folders:
        if task.review == Review.KEPT:
            raise Conflict("its changes were kept in your folder; the box does not take them back", field="review")
        extra["review"] = Review.UNDONE  # the layer is discarded; the real folder was never touched
    return transition(task, State.UNDONE, summary=f"undone by the owner ({principal.via})", data={"by": principal.via}, **extra)


def _move_review(task: Task, review: Review, summary: str, data: dict[str, Any]) -> Task:
    with transaction.atomic():
        _write_task(task, EventKind.NOTE, summary, {"review": review, **data}, review=review)
        if review == Review.KEPT:
            Layer.objects.filter(task=task).update(state=LayerState.APPLIED, applied_at=timezone.now())
    return task


def keep_review(principal: Principal, task_id: str) -> tuple[Task, list[str]]:
    """Apply a finished folder task's changes to the real folders, or report the conflicts."""
    task = get_task_for(principal, task_id)
    if not task.folders:
        raise Conflict("only folder tasks wait for Keep; a workspace task joined its workspace when it finished",
                       field="review")
    if not principal.can_use_folders:
        raise Forbidden("only the owner can keep changes to folders", field="review")
    if task.state != State.DONE or task.review not in (Review.PENDING, Review.CONFLICT):
        raise Conflict(f"a {task.state} task with review '{task.review or 'none'}' cannot be kept",
                       field="review", state=task.state)
    seal_layer(task.pk)
    with layer_lock(task.pk):
        layer = Layer.objects.get(task=task)
        changes = changes_of(task, layer)
        make, remove = review.directory_moves(task)
        found = review.find_conflicts(task, changes, make)
        if found:
            conflicts = [show(p) for p in sorted(found)]
            reasons = [found[p] for p in sorted(found)]
            shown = "; ".join(reasons[:5]) + (" …" if len(reasons) > 5 else "")
            task = _move_review(task, Review.CONFLICT, f"not kept: {shown}; nothing was applied",
                               {"conflicts": conflicts, "reasons": reasons})
            return task, conflicts
        review.apply_changes(task, changes, make, remove)
        task = _move_review(task, Review.KEPT, f"kept: {len(changes)} change(s) applied to your folder",
                           {"applied": [show(c.path) for c in changes[:500]]})
    return task, []


def fail_task(task: Task, error: str, *, recoverable: bool | None = None, hint: str = "",
              redactor: Redactor | None = None) -> Task:
    return transition(task, State.FAILED, error=error, recoverable=recoverable, hint=hint, redactor=redactor)


def note(task: Task, summary: str, data: dict[str, Any] | None = None) -> None:
    with transaction.atomic():
        record_event(task, EventKind.NOTE, summary, data)

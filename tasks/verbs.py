"""The owner's verbs on a task that exists: rerun, retry, cancel, undo, keep, and a dependency
added after creation. Each checks what the owner may do, then moves the task through
``tasks.services`` (``transition``, ``bump_version``), which alone writes where a task stands."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from boxsite.core.errors import Conflict, Forbidden, InvalidRequest
from boxsite.core.principal import Principal
from tasks import dependencies, services
from tasks.events import record_event
from tasks.layers import review
from tasks.layers.locks import layer_lock
from tasks.layers.paths import show
from tasks.layers.roots import changes_of
from tasks.layers.task_view import seal_layer
from tasks.layers.uploads import SOURCE as UPLOAD
from tasks.machines import calls, homes
from tasks.models import EventKind, Layer, LayerState, Run, RunKind, RunState, Task
from tasks.run import leases as runs
from tasks.run import lifecycle
from tasks.spec.task import RetryBody
from tasks.states import ACTIVE, Review, State
from tasks.vault.facts import Facts


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
    if task.notify:
        spec["notify"] = task.notify
    if task.output is not None:
        spec["output"] = task.output
    if task.vault_secrets:
        spec["vaultSecrets"] = task.vault_secrets
    if facts.values:
        spec["facts"] = facts.values
        spec["secretFacts"] = sorted(facts.secret_names)
    return spec


def rerun_task(principal: Principal, task_id: str, body: Any, *, source: str | None = None) -> Task:
    """A new task from an ended task's spec; ``body`` replaces any of its fields (the portal's
    form, edited). Checked whole, like any new task."""
    if not isinstance(body, dict):
        raise InvalidRequest("a rerun takes a JSON object: the fields to change, or {}")
    task = services.get_task_for(principal, task_id)
    if task.source == UPLOAD:
        raise Conflict("an upload is not run again: put the file again (PUT /api/workspaces/<name>/files/<path>)",
                       field="source")
    if not task.is_final_view():
        raise Conflict(f"task '{task.pk}' is {task.state}; only an ended task can run again (cancel it first)")
    return services.create_task({**spec_of(task), **body}, principal, source=source)


def retry_task(principal: Principal, task_id: str, body: Any) -> Task:
    """Send a recoverably failed task back to the queue, in place: the limits and budget the body
    names raised first (never lowered), its layer reopened, a ``retry`` run resuming from the step
    that failed with what earlier runs saved (``task.resume``, ``task.records``).

    Two retries at once: the conditional update (``_write_task``) lets exactly one through."""
    fields = RetryBody.parse({} if body is None else body)
    task = services.get_task_for(principal, task_id)
    _refuse_retry(task, fields.get("version"))
    raised = _raised(task, fields)
    # The failure's release (processes, user, mounts, the layer sealed) may still be in the
    # janitor's hands: finish it here, so the retry's run starts from a settled layer. Idempotent.
    lifecycle.release(task.pk)
    with transaction.atomic():
        services.refuse_at_capacity(services.locked_settings().max_active_tasks)
        updates: dict[str, Any] = {}
        if "limits" in raised:
            updates["limits"] = {**task.limits, **raised["limits"]}
        if "budgetCents" in raised:
            updates["budget_cents"] = raised["budgetCents"]
        shown = [f"limits.{name} to {value}" for name, value in raised.get("limits", {}).items()]
        shown += [f"budgetCents to {raised['budgetCents']}"] if "budgetCents" in raised else []
        summary = f"queued again: retried by the owner ({principal.via})" + (f"; raised {', '.join(shown)}" if shown else "")
        step = int((task.resume or {}).get("step", 0))
        services.transition(task, State.QUEUED, summary=summary,
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
    task = services.get_task_for(principal, task_id, for_update=True)
    if task.state not in ACTIVE:
        raise Conflict(f"a {task.state} task cannot be cancelled", field="state", state=task.state)
    by = {"by": principal.via}
    # Dependents are woken once every descendant has moved: a descendant that also waits on
    # the task is cancelled with it, not failed for its dependency.
    services.transition(task, State.CANCELLED, summary=f"cancelled by the owner ({principal.via})", data=by, wake=False)
    ended = [task.pk]
    for descendant in _descendants(task):
        # Top-down, each row locked before it moves (the lock order is always parent first).
        child = Task.objects.select_for_update().get(pk=descendant)
        if child.state in ACTIVE:
            services.transition(child, State.CANCELLED, summary=f"cancelled with task {task.pk}",
                       data={**by, "with": task.pk}, wake=False)
            ended.append(child.pk)
    for task_id in ended:
        services.wake_dependents(task_id)
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


def _holder_away(task: Task) -> str:
    """The other machine that holds ``task``'s layer ('' when this one does, or on one machine):
    an act on the layer is made there, where its files and locks are."""
    holder = homes.holder_of(task) if settings.BOX_MACHINE else ""
    return holder if homes.away(holder) else ""


def undo_task(principal: Principal, task_id: str) -> Task:
    task = services.get_task_for(principal, task_id)
    holder = _holder_away(task)
    if holder:
        calls.act(holder, "POST", f"{calls.PREFIX}/tasks/{task.pk}/undo", principal)
        return services.get_task_for(principal, task_id)
    extra: dict[str, Any] = {}
    if task.folders:
        if task.review == Review.KEPT:
            raise Conflict("its changes were kept in your folder; the box does not take them back", field="review")
        extra["review"] = Review.UNDONE  # the layer is discarded; the real folder was never touched
    return services.transition(task, State.UNDONE, summary=f"undone by the owner ({principal.via})", data={"by": principal.via}, **extra)


def _move_review(task: Task, review: Review, summary: str, data: dict[str, Any]) -> Task:
    with transaction.atomic():
        services.bump_version(task, EventKind.NOTE, summary, {"review": review, **data}, review=review)
        if review == Review.KEPT:
            Layer.objects.filter(task=task).update(state=LayerState.APPLIED, applied_at=timezone.now())
    return task


def keep_review(principal: Principal, task_id: str) -> tuple[Task, list[str]]:
    """Apply a finished folder task's changes to the real folders, or report the conflicts."""
    task = services.get_task_for(principal, task_id)
    holder = _holder_away(task)
    if holder:
        kept = calls.act(holder, "POST", f"{calls.PREFIX}/tasks/{task.pk}/keep", principal)
        return services.get_task_for(principal, task_id), list(kept["conflicts"])
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


@transaction.atomic
def add_dependency(principal: Principal, task_id: str, body: Any) -> Task:
    """An edge added after creation: only to a task that has not started (its queued first run
    is held back until the edges allow it)."""
    edges = dependencies.parse_edges([body])
    # The owner's lock before any task row: two requests adding x->y and y->x would otherwise
    # each hold one task row and wait for the other's (the edge's foreign keys lock both).
    dependencies.lock_owner(principal.user.pk)
    task = services.get_task_for(principal, task_id, for_update=True)
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
    transaction.on_commit(lambda: services.release_if_ready(task.pk))
    return task

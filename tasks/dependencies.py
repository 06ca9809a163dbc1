"""Dependency edges between tasks (docs/internals/task-graph.md#dependencies).

An edge says: ``task`` starts only once ``on`` has ended, and (when the edge is ``required``)
ended the way its ``condition`` asks: ``success`` (done), ``completion`` (any final state) or
``artifact`` (done, with the named file in its layer). ``add_edge`` is the only writer of edges
and refuses one that would close a cycle; ``verdict`` says whether a task may start now, must
wait, or can never start. Acting on a verdict (queueing the first run, failing the task) is
``tasks.services``'s: this module moves no task.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from django.contrib.auth import get_user_model
from django.db import transaction

from boxsite.core.errors import Conflict, InvalidSpec
from boxsite.core.shapes import Doc
from tasks import sql
from tasks.layers import paths
from tasks.layers.task_view import record_lost_seal, seal_layer
from tasks.layers.tree import FILE, LayerTree
from tasks.models import Condition, Dependency, Task
from tasks.states import ACTIVE, State

MAX_EDGES = 100  # dependencies of one task
ARTIFACT_ROOT = "outputs/"


@dataclass(frozen=True)
class EdgeSpec:
    """One ``dependsOn`` entry, checked: the task id as given, and what the edge asks."""

    on: str
    condition: str = Condition.SUCCESS
    required: bool = True
    artifact: str = ""

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"task": self.on, "condition": self.condition, "required": self.required}
        if self.artifact:
            shown["artifact"] = self.artifact
        return shown


def _artifact_path(raw: Any, field: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise InvalidSpec("an 'artifact' edge names the file it needs, e.g. \"outputs/report.md\"", field=field)
    if "\x00" in raw or raw.startswith("/") or "\\" in raw:
        raise InvalidSpec(f"'{raw}' is not a safe path under {ARTIFACT_ROOT}", field=field)
    clean = posixpath.normpath(raw)
    if not clean.startswith(ARTIFACT_ROOT) or ".." in clean.split("/") or len(clean) > 1024:
        raise InvalidSpec(f"'{raw}' is not a safe path under {ARTIFACT_ROOT}", field=field)
    return clean


def parse_edges(value: Any) -> list[EdgeSpec]:
    """``dependsOn`` as given: task ids, or ``{task, condition, required, artifact}`` objects."""
    if not isinstance(value, list):
        raise InvalidSpec("'dependsOn' must be a list of task ids or {task, condition, required} objects", field="dependsOn")
    if len(value) > MAX_EDGES:
        raise InvalidSpec(f"'dependsOn' holds at most {MAX_EDGES} tasks", field="dependsOn")
    edges: list[EdgeSpec] = []
    seen: set[str] = set()
    for index, item in enumerate(value):
        field = f"dependsOn[{index}]"
        if isinstance(item, str):
            item = {"task": item}
        if not isinstance(item, dict):
            raise InvalidSpec(f"'{field}' must be a task id or an object", field=field)
        unknown = sorted(set(item) - {"task", "condition", "required", "artifact"})
        if unknown:
            raise InvalidSpec(f"unknown field '{unknown[0]}' in '{field}'", field=f"{field}.{unknown[0]}")
        on = item.get("task")
        if not isinstance(on, str) or not on or len(on) > 24:
            raise InvalidSpec(f"'{field}.task' must be a task id", field=f"{field}.task")
        condition = item.get("condition", Condition.SUCCESS)
        if condition not in Condition.values:
            raise InvalidSpec(f"'{field}.condition' must be one of {', '.join(Condition.values)}", field=f"{field}.condition")
        required = item.get("required", True)
        if not isinstance(required, bool):
            raise InvalidSpec(f"'{field}.required' must be true or false", field=f"{field}.required")
        artifact = ""
        if condition == Condition.ARTIFACT:
            artifact = _artifact_path(item.get("artifact"), f"{field}.artifact")
        elif "artifact" in item:
            raise InvalidSpec(f"'{field}.artifact' is only for an 'artifact' condition", field=f"{field}.artifact")
        if on in seen:
            raise InvalidSpec(f"task '{on}' is named twice in 'dependsOn'", field=field)
        seen.add(on)
        edges.append(EdgeSpec(on=on, condition=condition, required=required, artifact=artifact))
    return edges


def lock_owner(owner_id: int, *, skip_locked: bool = False) -> bool:
    """Edges of one owner's tasks are added one transaction at a time: the cycle check reads the
    graph, and two concurrent insertions (A->B, B->A) must not both pass it. ``skip_locked``:
    do not wait; False when another transaction holds the lock."""
    rows = get_user_model().objects.select_for_update(skip_locked=skip_locked).filter(pk=owner_id)
    return bool(list(rows.values_list("pk", flat=True)))


def held_queued(task_id: str, *, skip_locked: bool) -> Task | None:
    """The task if it is queued, with its owner's row and its own locked for the rest of the
    transaction (PostgreSQL: ``skip_locked``, None when either is held elsewhere), in one
    statement (``sql.held_queued``); only the columns a release reads (its note's redactor: the
    facts) are loaded, the others when first used. On SQLite, a read."""
    return sql.held_queued(task_id, skip_locked=skip_locked)


def _reaches(start: str, target: str) -> bool:
    """``start`` depends, directly or through others, on ``target``. Nothing reaches a task that
    no task waits for (a task being created, always): one query instead of a walk up ``start``'s
    ancestry, one query per level (a chain's n-th link walked n levels)."""
    if not Dependency.objects.filter(on_id=target).exists():
        return False
    frontier, seen = {start}, {start}
    while frontier:
        if target in frontier:
            return True
        following = set(Dependency.objects.filter(task_id__in=frontier).values_list("on_id", flat=True)) - seen
        seen |= following
        frontier = following
    return False


def add_edge(task: Task, on: Task, edge: EdgeSpec, *, recovers: Dependency | None = None,
             new: bool = False) -> Dependency:
    """The one way an edge is added: ``task`` waits for ``on``. Refuses a self edge, a second
    edge between the same two tasks, and an edge that would close a cycle. ``recovers``: the
    failed edge a recovery review's edge replaces (``recovery_due``). ``new``: ``task`` is being
    created in this transaction, from edges ``parse_edges`` checked: it has no edge yet and
    nothing can wait for it, so neither check is asked of the database."""
    field = "dependsOn"
    if on.pk == task.pk:
        raise InvalidSpec("a task cannot depend on itself", field=field)
    if on.owner_id != task.owner_id:
        raise InvalidSpec(f"no task '{on.pk}'", field=field)
    # No savepoint of its own (two round trips): a refusal here ends its caller's transaction too.
    with transaction.atomic(savepoint=False):
        # Taken also for a new task: a dependency's final move takes it before it looks for
        # dependents, so it either sees this edge or has ended before the creation's verdict.
        lock_owner(task.owner_id)  # a no-op when the caller took it first
        if not new and Dependency.objects.filter(task=task, on=on).exists():
            raise Conflict(f"task '{task.pk}' already depends on '{on.pk}'", field=field)
        if not new and _reaches(on.pk, task.pk):
            raise Conflict(f"'{task.pk}' cannot depend on '{on.pk}': '{on.pk}' already waits for '{task.pk}' "
                           "(the edge would close a cycle)", field=field, code="DEPENDENCY_CYCLE")
        return Dependency.objects.create(task=task, on=on, condition=edge.condition, required=edge.required,
                                         artifact=edge.artifact, recovers=recovers,
                                         recovers_version=recovers.on.version if recovers is not None else None)


# --- resolution ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """``ready``: every edge resolved and every required one satisfied. ``failure``: a required
    edge can never be satisfied (why). Neither: some edge is still waiting. ``started``: the task
    already has a queued or running run (released before: nothing is left to decide)."""

    ready: bool = False
    failure: str = ""
    edge: Dependency | None = None  # with ``failure``: the edge that can never be satisfied
    started: bool = False
    waiting_on: tuple[str, ...] = ()  # the dependencies not ended yet, in the edges' order


def artifact_present(on_id: str, artifact: str, *, seal: bool = True) -> bool:
    """The done dependency's own layer holds ``artifact`` as a regular file."""
    if seal:
        seal_layer(on_id)  # a no-op once sealed; the layer is final after the dependency ended
        # This runs inside a dependent's decision, whose savepoint may be rolled back after the
        # seal (the decision taken again with more locks): its row's part then comes back here.
        record_lost_seal(on_id)
    directory = paths.layer_dir(on_id)
    if not directory.is_dir():
        return False
    entry = LayerTree.of_layer(directory).entry(artifact)
    return entry is not None and entry.kind == FILE


EdgeState = Literal["waiting", "satisfied", "unsatisfied"]


def edge_state(edge: Dependency, on_state: str, *, seal: bool = True) -> EdgeState:
    """``waiting`` (the dependency has not ended), ``satisfied`` or ``unsatisfied``."""
    if on_state in ACTIVE:
        return "waiting"
    if edge.condition == Condition.COMPLETION:
        return "satisfied"
    if on_state != State.DONE:
        return "unsatisfied"
    if edge.condition == Condition.ARTIFACT and not artifact_present(edge.on_id, edge.artifact, seal=seal):
        return "unsatisfied"
    return "satisfied"


def verdict_reason(edge: Dependency) -> str:
    return _why(edge, edge.on.state)


def _why(edge: Dependency, on_state: str) -> str:
    if edge.condition == Condition.ARTIFACT and on_state == State.DONE:
        return f"dependency {edge.on_id} is done but left no file '{edge.artifact}'"
    return f"dependency {edge.on_id} ended {on_state}; this task needed it to succeed"


def verdict(task: Task) -> Verdict:
    """Read in the dependency's final move, which holds its row (and on SQLite the one write
    lock), after the task's own row is held: the edges' own columns, each dependency's state and
    whether the task has an open run, in one statement (``sql.edges_of``); the edge that fails,
    when one does, is read whole."""
    found = sql.edges_of(task.pk)
    if found.started:
        return Verdict(started=True)
    waiting: list[str] = []
    for edge, on_state in found.edges:
        state = edge_state(edge, on_state)
        if state == "waiting":
            waiting.append(edge.on_id)
        elif state == "unsatisfied" and edge.required:
            failed = Dependency.objects.select_related("on").get(pk=edge.pk)
            return Verdict(failure=_why(failed, on_state), edge=failed)
    return Verdict(ready=not waiting, waiting_on=tuple(waiting))


def root_of(task_id: str) -> str:
    """The task at the top of ``task_id``'s ``parent`` chain (itself when it has no parent)."""
    seen = [task_id]
    while (parent := Task.objects.filter(pk=seen[-1]).values_list("parent_id", flat=True).first()) and parent not in seen:
        seen.append(parent)
    return seen[-1]


def recovery_due(edge: Dependency) -> bool:
    """A failed required edge between separate roots is replaced by one recovery review
    (``tasks.services.open_recovery_review``) instead of failing its task: the dependency failed
    (or ended done without the artifact), the two tasks have different root ancestors, and the
    edge has no review yet. Within one root the root closes together: no orphan recovery work."""
    if not edge.required or edge.on.state not in (State.FAILED, State.DONE) or Dependency.objects.filter(recovers=edge).exists():
        return False
    return root_of(edge.task_id) != root_of(edge.on_id)


def dependents_of(task_id: str, *, only_reading: bool = False) -> list[tuple[str, str]]:
    """(task id, edge condition) of each task that waits on ``task_id`` and has not started
    (``queued``); with ``only_reading``, only those whose edge checks its layer for an artifact.
    Asked at every final move (``sql.dependents_of``)."""
    return sql.dependents_of(task_id, only_condition=Condition.ARTIFACT.value if only_reading else None)


def has_edges(task: Task) -> bool:
    return Dependency.objects.filter(task=task).exists()


class DependencyEdge(TypedDict):
    task: str
    title: str
    state: Annotated[str, State, Doc("the other task's state")]
    condition: Annotated[str, Condition]
    required: bool
    artifact: NotRequired[str]
    edge: EdgeState


class DependencyGraph(TypedDict):
    dependencies: Annotated[list[DependencyEdge], Doc("the tasks this one waits for")]
    dependents: Annotated[list[DependencyEdge], Doc("the tasks that wait for this one")]


def graph(task: Task) -> DependencyGraph:
    """A task's edges both ways, for its view and the portal's graph: each names the other task,
    its state, what the edge asks and where the edge stands (``waiting``, ``satisfied``,
    ``unsatisfied``)."""
    def shown(edge: Dependency, other: Task, on_state: str) -> DependencyEdge:
        item: DependencyEdge = {"task": other.pk, "title": other.title, "state": other.state,
                                "condition": edge.condition, "required": edge.required,
                                "edge": edge_state(edge, on_state, seal=False)}
        if edge.artifact:
            item["artifact"] = edge.artifact
        return item

    deps = [shown(edge, edge.on, edge.on.state)
            for edge in Dependency.objects.filter(task=task).select_related("on").order_by("pk")]
    dependents = [shown(edge, edge.task, task.state)
                  for edge in Dependency.objects.filter(on=task).select_related("task").order_by("pk")]
    return {"dependencies": deps, "dependents": dependents}

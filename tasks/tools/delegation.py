"""What a running task may create: child tasks and schedules, within the owner's policy
(docs/internals/task-graph.md#tasks-that-create-work).

A task reaches these through its broker (``box task``, ``box schedule``) or as the built-in tools
``task.create`` and ``schedule.create`` (the agent's and a flow's way). Schedules are the
``schedules`` app's: it adds them (``schedules.delegation``) as a ``Maker``. The owner's settings
decide: ``tasks_may_create_work`` (off by default) and ``max_created_per_task`` (tasks and
schedules together, per creating task). A created task is the creator's child (``parent``), so
cancelling the creator cancels it; it and a created schedule record the task and run that asked.

Neither gets more than the creator may: hosts within its hosts (its hosts when none are named),
folders within its folders, its own workspace, tools among its tools, destructive steps only if
it may take them, and a budget within what it has left (the owner's default, capped there, when
none is named). A wider spec is refused, never narrowed in silence. Each refusal is a line in the
creator's log.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boxsite.core.errors import BoxError
from boxsite.core.principal import Principal
from boxsite.models import BoxSettings
from tasks import services
from tasks.broker.protocol import InvalidArgs, NotAllowed
from tasks.events import record_event
from tasks.models import EventKind, Task
from tasks.run.context import RunContext
from tasks.tools.http import host_covered
from tasks.tools.types import Tool

POLICY_OFF = ("the owner's settings do not let a task create {what} "
              "(Settings → Tasks that create work; it is off by default)")


@dataclass(frozen=True)
class Maker:
    """Something besides a task that a running task may create, kept by an app above tasks
    (``schedules`` adds "schedule"). ``create`` makes it from the body the broker or the tool was
    given, under the creator's lease (``guarded``, ``check_policy``, ``bounded``), and returns the
    answer both give; ``count`` is how many of them a task has created."""

    create: Callable[[RunContext, Any], dict[str, Any]]
    count: Callable[[Task], int]


# Filled by the apps' ``ready()``, by kind.
MAKERS: dict[str, Maker] = {}


def add_maker(kind: str, maker: Maker) -> None:
    MAKERS[kind] = maker


def create(kind: str, ctx: RunContext, body: Any) -> dict[str, Any]:
    """Create a ``kind`` (a schedule) for ``ctx.task``: the broker's ``box schedule``."""
    maker = MAKERS.get(kind)
    if maker is None:
        raise NotAllowed(f"this box has no {kind}s for a task to create")
    return maker.create(ctx, body)


def create_child(ctx: RunContext, spec: Any) -> Task:
    """A child task of ``ctx.task`` from ``spec`` (as ``POST /api/tasks`` takes it, bounded)."""
    task = ctx.task

    def write() -> Task:
        check_policy(task, "tasks")
        body = bounded(task, spec, "spec")
        body["parent"] = task.pk
        child = services.create_task(body, Principal.of_task(task, ctx.run.number), source=f"task:{task.pk}")
        record_event(task, EventKind.NOTE, f"created task {child.pk}: {child.title}",
                     {"created": {"task": child.pk}, "run": ctx.run.number})
        return child

    return guarded(ctx, "a task", write)


def guarded(ctx: RunContext, what: str, write: Any) -> Any:
    """``write`` under the run's lease (the creator's row locked: its count cannot race); a refusal
    rolls it back and is then written to the creator's log."""
    try:
        return ctx.recorder.guarded(write)
    except BoxError as exc:
        ctx.recorder.event(EventKind.ERROR, f"refused to create {what}: {exc.message}",
                           {"refused": {"code": exc.code, "field": exc.field, "message": exc.message}})
        raise


def check_policy(task: Task, what: str) -> None:
    policy = BoxSettings.current()
    if not policy.tasks_may_create_work:
        raise NotAllowed(POLICY_OFF.format(what=what))
    made = Task.objects.filter(created_by_task=task).count() + sum(maker.count(task) for maker in MAKERS.values())
    if made >= policy.max_created_per_task:
        raise NotAllowed(f"this task already created {made} tasks and schedules, the most one task may "
                         f"(Settings → Most tasks and schedules one task may create)")


def bounded(task: Task, spec: Any, field: str) -> dict[str, Any]:
    """``spec`` with nothing wider than ``task`` may have: refused where it asks for more,
    filled from the creator where it names nothing."""
    if not isinstance(spec, dict):
        raise InvalidArgs(f"'{field}' must be a task spec (a JSON object)", field=field)
    body = dict(spec)
    for key in ("parent", "source"):
        if key in body:
            raise InvalidArgs(f"'{key}' is set by the box for a task a task creates", field=f"{field}.{key}")
    body["hosts"] = _hosts(task, body.get("hosts", task.hosts), field)
    body["budgetCents"] = _budget(task, body.get("budgetCents"), field)
    tools = body.get("tools", [])
    if isinstance(tools, list):
        wider = [name for name in tools if name not in (task.tools or [])]
        if wider:
            raise NotAllowed(f"tool '{wider[0]}' is not one this task may call", field=f"{field}.tools")
    constraints = body.get("constraints")
    if isinstance(constraints, dict) and constraints.get("allow_destructive") and not task.constraints.get("allow_destructive"):
        raise NotAllowed("this task may not take destructive steps without the owner's OK, so neither may what it creates",
                         field=f"{field}.constraints.allow_destructive")
    folders = body.get("folders", [body["folder"]] if "folder" in body else [])
    if isinstance(folders, list):
        for path in folders:
            if not _within_folders(path, task.folders):
                raise NotAllowed(f"'{path}' is not within this task's folders", field=f"{field}.folders")
    if not folders and not task.folders:
        if body.setdefault("workspace", task.workspace.name) != task.workspace.name:
            raise NotAllowed(f"this task works in workspace '{task.workspace.name}'; what it creates works there too",
                             field=f"{field}.workspace")
    return body


def _hosts(task: Task, hosts: Any, field: str) -> Any:
    if not isinstance(hosts, list):
        return hosts  # the spec's own check answers it
    for host in hosts:
        if isinstance(host, str) and not host_covered(host.lower(), task.hosts):
            allowed = ", ".join(task.hosts) or "none"
            raise NotAllowed(f"host '{host}' is wider than this task's hosts ({allowed})", field=f"{field}.hosts")
    return hosts


def _budget(task: Task, asked: Any, field: str) -> Any:
    left = max(0, task.budget_cents - task.cost_cents)
    if asked is None:
        return min(BoxSettings.current().default_budget_cents, left)
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > left:
        raise NotAllowed(f"a budget of {asked}¢ is more than this task has left ({left}¢)", field=f"{field}.budgetCents")
    return asked


def _within_folders(path: Any, folders: list[str]) -> bool:
    if not isinstance(path, str) or not path.startswith("/"):
        return False
    real = Path(path).resolve()
    return any(real == Path(folder) or real.is_relative_to(folder) for folder in folders)


# --- the same, as tools (the agent's and a flow's ``tool`` step) ------------------------------

def _task_tool(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    child = create_child(ctx, args["spec"])
    return {"task": child.pk, "state": child.state}


TOOLS = (
    Tool(
        name="task.create",
        description="Create a child task (a task spec: title, prompt or command, ...). Only when the owner allows "
                    "tasks to create work; it gets no more hosts, folders, tools or budget than this task.",
        schema={"type": "object", "properties": {"spec": {"type": "object"}}, "required": ["spec"],
                "additionalProperties": False},
        impl=_task_tool,
    ),
)

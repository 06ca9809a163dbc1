"""How a task, its events and its runs look to callers. All values pass the redaction function."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.models import Run, Task, TaskEvent
from tasks.spec.limits import DEFAULT_LIMITS
from tasks.states import Review, State, WaitingFor
from tasks.vault.facts import Facts, Redactor


@dataclass(frozen=True)
class Section:
    """A part of a task's view that an app above tasks presents (``approvals`` adds the task's
    approvals and questions): ``detail`` for ``GET /api/tasks/<id>``, ``report`` for its report,
    which passes the report's redaction function."""

    detail: Callable[[Task], list[dict[str, Any]]]
    report: Callable[[Task, Redactor], list[dict[str, Any]]]


# Filled by the apps' ``ready()``, by name, in the order the view shows them.
SECTIONS: dict[str, Section] = {}


def add_section(name: str, section: Section) -> None:
    SECTIONS[name] = section


def detail_sections(task: Task) -> dict[str, list[dict[str, Any]]]:
    return {name: section.detail(task) for name, section in SECTIONS.items()}


def report_sections(task: Task, redact: Redactor) -> dict[str, list[dict[str, Any]]]:
    return {name: section.report(task, redact) for name, section in SECTIONS.items()}


def is_final_view(task: Task) -> bool:
    """Final for a caller: a final state, or a checkpoint that cannot be continued (a payment
    page: a person finishes it outside the box, and only cancel or undo releases what the task holds)."""
    return task.is_final() or (task.state == State.WAITING and task.waiting_for == WaitingFor.CHECKPOINT and not task.continuable)


def next_calls(task: Task) -> list[str]:
    """The calls that make sense now, so clients never hardcode the state machine."""
    calls: list[str] = []
    if task.state == State.WAITING and task.waiting_for == WaitingFor.CHECKPOINT and not task.continuable:
        return ["cancel", "undo", "diff", "report"]
    if task.state == State.WAITING:
        if task.waiting_for in (WaitingFor.INPUT, WaitingFor.HUMAN):
            calls.append("continue")
        elif task.waiting_for == WaitingFor.APPROVAL or (task.waiting_for == WaitingFor.CHECKPOINT and task.continuable):
            calls += ["continue", "approve", "deny"]
    if task.review in (Review.PENDING, Review.CONFLICT):
        calls.append("keep")
    if task.state in (State.QUEUED, State.RUNNING, State.WAITING):
        calls.append("cancel")
    if task.state != State.UNDONE and task.review != Review.KEPT:
        calls.append("undo")
    calls += ["diff", "report"]
    if task.state == State.FAILED and task.recoverable is True:
        calls.append("retry")  # in place, from the step that failed (tasks.verbs.retry_task)
    if is_final_view(task):
        calls.append("rerun")
    return calls


def limits_in_force(task: Task) -> dict[str, int | None]:
    """Every limit the task runs under: its own where it set one, else the box's default
    (``None``: unbounded)."""
    return {name: task.limit(name) for name in DEFAULT_LIMITS}


def present_task(task: Task) -> dict[str, Any]:
    facts = Facts.of(task)
    redact = facts.redactor()
    shown_facts = facts.shown()
    view = {
        "id": task.pk,
        "title": task.title,
        "prompt": task.prompt,
        "workspace": task.workspace.name,
        "worker": task.worker,
        "command": task.command,
        "tools": task.tools,
        "hosts": task.hosts,
        "budgetCents": task.budget_cents,
        "source": task.source,
        "flow": task.flow,
        "facts": shown_facts,
        "secretFacts": sorted(facts.secret_names),
        "constraints": task.constraints,
        "limits": limits_in_force(task),
        "output": task.output,
        "result": (task.records or {}).get("result") if task.output else None,
        "answer": (task.records or {}).get("answer") if not task.flow else None,
        "folders": task.folders,
        "dependsOn": task.depends_on,
        "criteria": task.criteria,
        "parent": task.parent_id,
        "createdBy": {"task": task.created_by_task_id, "run": task.created_by_run} if task.created_by_task_id else None,
        "state": task.state,
        "waitingFor": task.waiting_for or None,
        "continuable": task.continuable if task.waiting_for == WaitingFor.CHECKPOINT else None,
        "final": is_final_view(task),
        "pause": task.pause or None,
        "version": task.version,
        "user": task.user,
        "layers": task.layers,
        "costCents": task.cost_cents,
        "spent": task.spent,
        "step": task.step,
        "progress": task.progress,
        "error": task.error or None,
        "recoverable": task.recoverable,
        "hint": task.hint or None,
        "review": task.review or None,
        "isolation": task.isolation or None,
        "lastSeq": task.event_seq,
        "externalTaskId": task.external_task_id or None,
        "externalAttempt": task.external_attempt,
        "createdAt": task.created_at,
        "startedAt": task.started_at,
        "finishedAt": task.finished_at,
        "historyPrunedAt": task.history_pruned_at,
        "updatedAt": task.updated_at,
        "next": next_calls(task),
    }
    return redact.redact(_jsonable(view))


def present_run(run: Run, redact: Redactor) -> dict[str, Any]:
    """One attempt as the owner sees it: never its resume point, lease, worker or paths."""
    elapsed = None
    if run.started_at and run.finished_at:
        elapsed = int((run.finished_at - run.started_at).total_seconds() * 1000)
    return {
        "number": run.number,
        "mode": run.kind,
        "attempt": run.attempt,
        "state": run.state,
        "outcome": run.outcome or None,
        "error": redact.text(run.error) if run.error else None,
        "charged": run.charged and run.started_at is not None,
        "usage": {"elapsedMs": elapsed},
        "createdAt": run.created_at.isoformat(),
        "startedAt": run.started_at.isoformat() if run.started_at else None,
        "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
    }


def present_event(event: TaskEvent) -> dict[str, Any]:
    return {
        "id": event.pk,
        "seq": event.seq,
        "kind": event.kind,
        "summary": event.summary,
        "data": event.data,
        "costCents": event.cost_cents,
        "artifacts": event.artifacts,
        "createdAt": event.created_at.isoformat(),
    }


def _jsonable(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value

"""The task report (``GET /api/tasks/<id>/report``): everything a task did, redacted.

The view, the flow, one entry per step reached, the records steps saved, the runs, approvals,
questions and rescues. Built from the action log and the task row, and passed whole through the
task's redaction function on the way out.
"""
from __future__ import annotations

from typing import Annotated, Any, NotRequired, TypedDict

from boxsite.core.shapes import DateTime, Doc, leave_open
from tasks.api.presenters import ApprovalViews, Artifact, Flow, QuestionViews, TaskView, present_task, report_sections
from tasks.models import EventKind, Run, RunKind, RunState, Task, TaskEvent
from tasks.spec.flows import step_kind
from tasks.states import State
from tasks.vault.facts import open_records, redactor_for

MAX_STEP_EVENTS = 5000


class StepResult(TypedDict):
    """what the step did (its step_result event's data, which varies by kind), and its files"""

    summary: str
    artifacts: list[Artifact]


leave_open(StepResult)


class FlowStep(TypedDict):
    """a flow step reached, with how it ended"""

    step: Annotated[int, Doc("1-based, in flow order")]
    kind: str
    name: str | None
    attempts: int
    summary: str | None
    firstAt: DateTime | None
    lastAt: DateTime | None
    saved: NotRequired[str]
    stopBefore: NotRequired[str]
    result: NotRequired[StepResult]
    outcome: NotRequired[Annotated[str, Doc("done, not reached, waiting for …, failed, cancelled, undone or running")]]


class PlainStep(TypedDict):
    """a step a worker without a flow reported, with the result its process left"""

    step: int
    summary: str
    at: DateTime
    result: NotRequired[StepResult]


class ReportRun(TypedDict):
    number: int
    kind: Annotated[str, RunKind]
    attempt: int
    state: Annotated[str, RunState]
    outcome: str | None
    error: str | None
    startedAt: DateTime | None
    finishedAt: DateTime | None


class Rescue(TypedDict):
    seq: int
    summary: str
    data: dict[str, Any]
    at: DateTime


class Hint(TypedDict):
    instruction: str
    page: str
    selector: str


class Report(TypedDict):
    view: TaskView
    flow: Flow
    steps: list[FlowStep] | list[PlainStep]
    records: Annotated[dict[str, Any], Doc("what the steps saved, by name")]
    output: dict[str, Any] | None
    result: Any
    runs: list[ReportRun]
    approvals: ApprovalViews
    questions: QuestionViews
    rescues: list[Rescue]
    memory: Annotated[list[Hint], Doc("grounding hints learned, for a later flow's memory")]


def build_report(task: Task) -> Report:
    redact = redactor_for(task)
    step_events: list[dict[str, Any]] = [
        dict(row) for row in TaskEvent.objects.filter(task=task, kind__in=(EventKind.STEP, EventKind.STEP_RESULT))
        .order_by("seq").values("seq", "kind", "summary", "data", "artifacts", "created_at")[:MAX_STEP_EVENTS]
    ]
    rescue_events = TaskEvent.objects.filter(task=task, data__has_key="rescue").order_by("seq")
    sections = report_sections(task, redact)  # the approvals and questions (approvals.presenters)
    report: Report = {
        "view": present_task(task),
        "flow": task.flow,
        "steps": _flow_steps(task, step_events) if task.flow else _plain_steps(step_events),
        "records": open_records(task.records or {}),  # shown redacted, by the pass below
        "output": task.output,
        "result": (task.records or {}).get("result") if task.output else None,
        "runs": [_run(r) for r in Run.objects.filter(task=task).order_by("number")],
        "approvals": sections.get("approvals", []),
        "questions": sections.get("questions", []),
        "rescues": [{"seq": e.seq, "summary": e.summary, "data": e.data, "at": e.created_at.isoformat()} for e in rescue_events],
        "memory": _learned(step_events),
    }
    return redact.redact(report)


def _learned(events: list[dict[str, Any]]) -> list[Hint]:
    """Grounding hints the task's steps found or confirmed (a later flow's ``memory``)."""
    hints: dict[tuple[str, str], Hint] = {}
    for event in events:
        found = (event.get("data") or {}).get("grounding") if event["kind"] == EventKind.STEP_RESULT else None
        if isinstance(found, dict) and found.get("selector") and (event.get("data") or {}).get("ok"):
            hints[(found["instruction"], found["page"])] = {"instruction": found["instruction"], "page": found["page"],
                                                           "selector": found["selector"]}
    return list(hints.values())


def _flow_steps(task: Task, events: list[dict[str, Any]]) -> list[FlowStep]:
    """One entry per flow step reached, in flow order, with how it ended."""
    steps = (task.flow or {}).get("steps", [])
    reached: dict[int, FlowStep] = {}
    for event in events:
        number = (event["data"] or {}).get("step")  # 1-based, as in the log's summaries
        if not isinstance(number, int) or not 1 <= number <= len(steps):
            continue
        index = number - 1
        entry = reached.get(index)
        if entry is None:
            entry = reached[index] = _entry(steps, index)
            entry["firstAt"] = event["created_at"].isoformat()
        if event["kind"] == EventKind.STEP_RESULT:
            entry["result"] = _result(event)
            continue
        entry["attempts"] += 1
        entry["summary"] = event["summary"]
        entry["lastAt"] = event["created_at"].isoformat()
    resume_at = int((task.resume or {}).get("step", 0))
    if task.state == State.WAITING and 0 <= resume_at < len(steps) and resume_at not in reached:
        reached[resume_at] = _entry(steps, resume_at)  # a gate reached and waiting, not run yet
    for index, entry in reached.items():
        entry["outcome"] = _outcome(task, index, resume_at)
    return [reached[i] for i in sorted(reached)]


def _entry(steps: list[dict[str, Any]], index: int) -> FlowStep:
    step = steps[index]
    entry: FlowStep = {"step": index + 1, "kind": step_kind(step), "name": step.get("name"), "attempts": 0,
                             "summary": None, "firstAt": None, "lastAt": None}
    if "save" in step:
        entry["saved"] = step["save"]
    if "stop_before" in step:
        entry["stopBefore"] = step["stop_before"]
    return entry


def _outcome(task: Task, index: int, resume_at: int) -> str:
    if task.state == State.DONE or index < resume_at:
        return "done"
    if index > resume_at:
        return "not reached"
    if task.state == State.WAITING:
        return f"waiting for {task.waiting_for}"
    if task.state == State.FAILED:
        return "failed"
    if task.state in (State.CANCELLED, State.UNDONE):
        return task.state
    return "running"


def _plain_steps(events: list[dict[str, Any]]) -> list[PlainStep]:
    """A worker without a flow (a command, the agent): each step it reported, in order, with
    the result the worker's process left (exit code, output, the lines it reported)."""
    entries: list[PlainStep] = []
    for event in events:
        if event["kind"] == EventKind.STEP_RESULT:
            if entries:
                entries[-1]["result"] = _result(event)
            continue
        entries.append({"step": len(entries) + 1, "summary": event["summary"], "at": event["created_at"].isoformat()})
    return entries


def _result(event: dict[str, Any]) -> StepResult:
    """A ``step_result`` event as the report shows it: what the step did, and its files."""
    data = {k: v for k, v in (event["data"] or {}).items() if k not in ("step", "of", "kind")}
    return {**data, "summary": event["summary"], "artifacts": event["artifacts"] or []}


def _run(run: Run) -> ReportRun:
    return {
        "number": run.number, "kind": run.kind, "attempt": run.attempt, "state": run.state, "outcome": run.outcome or None,
        "error": run.error or None,
        "startedAt": run.started_at.isoformat() if run.started_at else None,
        "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
    }

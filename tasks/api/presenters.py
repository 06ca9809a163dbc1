"""How a task, its events and its runs look to callers. All values pass the redaction function."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from boxsite.core.shapes import REF, DateTime, Doc, Raw, chosen_by, leave_open
from tasks.llm.client import TokenUsage
from tasks.models import Condition, EventKind, Run, RunKind, RunState, Task, TaskEvent
from tasks.spec.describe import flow_schema
from tasks.spec.limits import DEFAULT_LIMITS
from tasks.states import Review, State, WaitingFor
from tasks.vault.facts import Facts, Redactor


@dataclass(frozen=True)
class Section:
    """A part of a task's view that an app above tasks presents (``approvals`` adds the task's
    approvals and questions): ``detail`` for ``GET /api/tasks/<id>``, ``report`` for its report,
    which passes the report's redaction function."""

    detail: Callable[[Task], list[Any]]
    report: Callable[[Task, Redactor], list[Any]]


# Filled by the apps' ``ready()``, by name, in the order the view shows them.
SECTIONS: dict[str, Section] = {}


def add_section(name: str, section: Section) -> None:
    SECTIONS[name] = section


def detail_sections(task: Task) -> dict[str, list[Any]]:
    return {name: section.detail(task) for name, section in SECTIONS.items()}


def report_sections(task: Task, redact: Redactor) -> dict[str, list[Any]]:
    return {name: section.report(task, redact) for name, section in SECTIONS.items()}


# The sections' shapes are declared where they are built (``approvals.presenters``); a task's view
# and report name them by their components, so tasks does not import the app above it.
ApprovalViews = Annotated[list[Any], Raw({"type": "array", "items": {"$ref": f"{REF}ApprovalView"}})]
QuestionViews = Annotated[list[Any], Raw({"type": "array", "items": {"$ref": f"{REF}QuestionView"}})]

Flow = Annotated[dict[str, Any] | None, Raw({"anyOf": [flow_schema(), {"type": "null"}]})]
NextCall = Literal["continue", "approve", "deny", "keep", "cancel", "undo", "diff", "report", "retry", "rerun"]


class CreatedBy(TypedDict):
    task: str
    run: int | None


class DependsOnItem(TypedDict):
    """a dependency as the task was given it (``tasks.dependencies.parse_edges``)"""

    task: str
    condition: Annotated[str, Condition]
    required: bool
    artifact: NotRequired[Annotated[str, Doc("with condition artifact: the file the other task must leave")]]
    recovers: NotRequired[Annotated[str, Doc("a recovery review's edge: the dependency whose failure the review "
                                             "decides on (the box adds it)")]]


class OutputFileCriterion(TypedDict):
    """a completion criterion: a file the task must leave (``tasks.run.completion.parse_criteria``)"""

    kind: Literal["output_file"]
    path: str
    size: NotRequired[int]
    sha256: NotRequired[str]
    mediaType: NotRequired[str]
    contains: NotRequired[str]
    json: NotRequired[Annotated[dict[str, Any], Doc("JSON Pointer (RFC 6901) to the value expected there")]]


class CommandExitCriterion(TypedDict):
    """a completion criterion: a command the run must have run, and its exit code"""

    kind: Literal["command_exit"]
    command: str
    exitCode: int


class TaskConstraints(TypedDict, total=False):
    """how the task may act on the world (``tasks.spec.task.ConstraintsBody``)"""

    payment: Literal["stop_at_payment", "fill_then_approve"]
    origins: list[str]
    allow_destructive: bool
    browser_profile: str
    headed: bool
    browser_executable: str


class InputField(TypedDict):
    """a value a pause or a question asks for"""

    name: str
    why: str
    kind: Annotated[str, Doc("text, email, phone, date, number, choice or vault (an ask step may name its own)")]
    options: list[Any]
    optional: NotRequired[Annotated[bool, Doc("true: may be left empty")]]


class TaskPause(TypedDict):
    """what a waiting task's pause asks for"""

    message: str
    fields: NotRequired[Annotated[list[InputField], Doc("for an input pause: the values asked for")]]
    continuable: NotRequired[Annotated[bool, Doc("at a checkpoint: whether continue goes on")]]
    held: NotRequired[Annotated[bool, Doc("true: the run holds its place while it waits (a broker's approval or question)")]]
    amount_cents: NotRequired[Annotated[int, Doc("a held spending approval's amount")]]


class TaskSpent(TypedDict, total=False):
    """what the task has used, counted against its limits"""

    actions: int
    model_calls: int
    elapsed_ms: int
    rescues: int
    plans: int
    replans: int
    final_replans: int
    model_millicents: int


class TaskView(TypedDict):
    id: str
    title: str
    prompt: str
    workspace: str
    worker: str
    command: list[str] | None
    tools: list[str]
    hosts: list[str]
    budgetCents: int
    source: str
    flow: Flow
    facts: Annotated[dict[str, Any], Doc("the task's facts; secret values shown as ${name}")]
    secretFacts: list[str]
    vaultSecrets: Annotated[list[str], Doc("vault secrets the task may use as ${NAME} (names only)")]
    constraints: TaskConstraints
    limits: Annotated[dict[str, int | None], Doc("every limit in force; null is unbounded")]
    output: Annotated[dict[str, Any] | None, Doc("the output contract: the shape the result takes")]
    result: Annotated[Any, Doc("with output: the answer shaped to output.schema from the task's records (else null)")]
    answer: Annotated[Any, Doc("a plain-language task's answer (the agent's finish, a planned flow's last result), else null")]
    folders: list[str]
    dependsOn: list[DependsOnItem]
    criteria: Annotated[list[OutputFileCriterion | CommandExitCriterion] | None, Doc("the completion contract, or null")]
    notify: Annotated[dict[str, bool], Doc("{done: true} when the owner asked to be told the task is done, else {}")]
    parent: str | None
    createdBy: Annotated[CreatedBy | None, Doc("the task (and its run) that created this one, else null")]
    state: Annotated[str, State]
    waitingFor: Annotated[str, WaitingFor] | None
    continuable: bool | None
    final: bool
    pause: TaskPause | None
    version: int
    user: str
    layers: list[str]
    costCents: int
    spent: TaskSpent
    step: Annotated[str, Doc("what the task is doing now; empty when nothing")]
    progress: float | None
    error: str | None
    recoverable: bool | None
    hint: str | None
    review: Annotated[str, Review] | None
    isolation: str | None
    lastSeq: int
    externalTaskId: str | None
    externalAttempt: int | None
    createdAt: DateTime
    startedAt: DateTime | None
    finishedAt: DateTime | None
    historyPrunedAt: Annotated[DateTime | None, Doc("when retention removed a done task's history; its layer stays")]
    updatedAt: DateTime
    next: Annotated[list[NextCall], Doc("the calls that make sense now")]


class Artifact(TypedDict):
    name: str
    type: str
    size: int
    url: str


# An event's data, by kind, as the code that writes each kind builds it (``record_event`` and
# ``StepRecorder.event`` calls). Keys every writer of a kind sets are required; a kind whose
# writers add keys of their own (a step's evidence, a note) is open to them.

StatusData = TypedDict("StatusData", {
    "to": Annotated[str, State],
    "from": NotRequired[Annotated[str, State]],
    "waiting_for": NotRequired[Annotated[str, WaitingFor]],
})
StatusData.__doc__ = "a status event's data: the move, and what it adds"
leave_open(StatusData)


class CostData(TypedDict):
    """a cost event's data: what was charged, and what for"""

    cents: int


leave_open(CostData)


class StepData(TypedDict, total=False):
    """a step event's data: which step begins (a flow's, a command's, an agent's turn, a shaping
    of the output, a step the broker announces), and what the worker adds about it"""

    step: Annotated[int, Doc("the step's number, from 1 (an agent's turn)")]
    of: Annotated[int, Doc("how many steps the flow has")]
    kind: Annotated[str, Doc("the step's kind (run, write, http, model, command, output, ...)")]
    retry: Annotated[bool, Doc("an earlier run began this step and was cut off")]
    run: Annotated[int, Doc("with retry: the run that executes the step again")]


leave_open(StepData)


class StepResultData(TypedDict):
    """a step_result event's data: what the step did; its evidence adds keys by kind"""

    step: int
    of: NotRequired[Annotated[int, Doc("how many steps the flow has (an agent's turn has no total)")]]
    kind: str
    ok: bool
    startedAt: DateTime
    durationMs: int
    error: NotRequired[str]


leave_open(StepResultData)


class ToolCallData(TypedDict):
    """a tool_call event's data: the tool and its arguments; a call the box refused names why"""

    tool: str
    args: Annotated[dict[str, Any], Doc("as called, bounded")]
    call: NotRequired[Annotated[str, Doc("the model's id of the call")]]
    refused: NotRequired[str]
    cost_cents: NotRequired[int]
    action: NotRequired[Annotated[int, Doc("the consequential action it is")]]


leave_open(ToolCallData)


class ToolResultData(TypedDict):
    """a tool_result event's data: whether the call succeeded, and its result or error; the
    step's evidence adds keys by kind"""

    tool: str
    ok: bool
    call: NotRequired[str]
    error: NotRequired[str]
    result: NotRequired[Any]
    action: NotRequired[int]
    replayed: NotRequired[Annotated[bool, Doc("done before: its receipt answered, not called again")]]
    receipt: NotRequired[dict[str, Any]]


leave_open(ToolResultData)


class ApprovalData(TypedDict):
    """an approval event's data: the approval asked for, or the decision on it"""

    approval: int
    kind: Annotated[str, Doc("irreversible, spending, action, payment or checkpoint")]
    amount_cents: NotRequired[Annotated[int | None, Doc("when asked: the budget a spending approval asks for")]]
    decision: NotRequired[Annotated[str, Doc("when decided: approved or denied")]]
    via: NotRequired[Annotated[str, Doc("when decided: how (web, phone, token)")]]
    version: NotRequired[Annotated[int, Doc("when approved: the task's version the decision made")]]


class QuestionData(TypedDict, total=False):
    """a question event's data: the question asked (question, kind, fields), or the answer to
    the open ones (questions, names, via, version)"""

    question: int
    kind: str
    fields: list[InputField]
    questions: list[int]
    names: Annotated[list[str], Doc("the inputs the answer gave")]
    via: str
    version: int


class BlockedConnectionData(TypedDict):
    """a blocked_connection event's data: what the egress proxy or the box's own HTTP client
    (host, port), or the browser (url, origin) refused, and why"""

    reason: str
    via: Literal["egress proxy", "http client", "browser"]
    host: NotRequired[str]
    port: NotRequired[int]
    url: NotRequired[str]
    origin: NotRequired[str]
    redirect: NotRequired[bool]  # the browser refused a hop of a redirect


class OutputData(TypedDict, total=False):
    """an output event's data: a command's line has none; an agent's answer, or the output
    shaped to the task's output contract"""

    answer: str
    kind: Literal["output"]
    result: Any
    usage: TokenUsage


class Refusal(TypedDict):
    code: str
    field: str | None
    message: str


class ErrorData(TypedDict, total=False):
    """an error event's data: a run's failure (recoverable, hint), an output that could not be
    shaped (kind, error), or a task the box refused to create (refused)"""

    recoverable: bool | None
    hint: str
    kind: Literal["output"]
    error: str
    refused: Refusal


class NoteData(TypedDict, total=False):
    """a note event's data: its keys are the noted thing's own"""

    version: Annotated[int, Doc("the task's version, when the note moved it")]
    via: str


leave_open(NoteData)


class Event(TypedDict):
    id: int
    seq: int
    kind: Annotated[str, EventKind]
    summary: str
    data: Annotated[dict[str, Any], Doc("by kind: see the kind's data shape")]
    costCents: int
    artifacts: list[Artifact] | None
    createdAt: DateTime


chosen_by(Event, "kind", "data", {
    EventKind.STATUS: StatusData, EventKind.COST: CostData, EventKind.STEP: StepData, EventKind.STEP_RESULT: StepResultData,
    EventKind.TOOL_CALL: ToolCallData, EventKind.TOOL_RESULT: ToolResultData, EventKind.APPROVAL: ApprovalData,
    EventKind.QUESTION: QuestionData, EventKind.BLOCKED_CONNECTION: BlockedConnectionData, EventKind.OUTPUT: OutputData,
    EventKind.ERROR: ErrorData, EventKind.NOTE: NoteData,
})


class EventPage(TypedDict):
    events: list[Event]
    after: int
    nextAfter: int
    more: bool


class TaskPage(TypedDict):
    results: list[TaskView]
    next: Annotated[str | None, Doc("the cursor of the next page")]


class Usage(TypedDict):
    elapsedMs: int | None


class RunView(TypedDict):
    number: int
    mode: Annotated[str, RunKind]
    attempt: Annotated[int, Doc("tries of the same resume point")]
    state: Annotated[str, RunState]
    outcome: str | None
    error: str | None
    charged: Annotated[bool, Doc("counted against the task's attempts (a wait for the owner is refunded)")]
    usage: Usage
    createdAt: DateTime
    startedAt: DateTime | None
    finishedAt: DateTime | None


class Attempts(TypedDict):
    total: Annotated[int, Doc("runs that started")]
    charged: Annotated[int, Doc("of those, the ones counted against the task")]


class RunPage(TypedDict):
    results: list[RunView]
    next: str | None
    attempts: Attempts


def next_calls(task: Task) -> list[NextCall]:
    """The calls that make sense now, so clients never hardcode the state machine."""
    calls: list[NextCall] = []
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
    if task.is_final_view():
        calls.append("rerun")
    return calls


def limits_in_force(task: Task) -> dict[str, int | None]:
    """Every limit the task runs under: its own where it set one, else the box's default
    (``None``: unbounded)."""
    return {name: task.limit(name) for name in DEFAULT_LIMITS}


def present_task(task: Task) -> TaskView:
    facts = Facts.of(task)
    redact = facts.redactor()
    shown_facts = facts.shown()
    view: TaskView = {
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
        "vaultSecrets": list(task.vault_secrets or []),
        "constraints": task.constraints,
        "limits": limits_in_force(task),
        "output": task.output,
        "result": (task.records or {}).get("result") if task.output else None,
        "answer": (task.records or {}).get("answer") if not task.flow or (task.spent or {}).get("plans") else None,
        "folders": task.folders,
        "dependsOn": task.depends_on,
        "criteria": task.criteria,
        "notify": task.notify or {},
        "parent": task.parent_id,
        "createdBy": {"task": task.created_by_task_id, "run": task.created_by_run} if task.created_by_task_id else None,
        "state": task.state,
        "waitingFor": task.waiting_for or None,
        "continuable": task.continuable if task.waiting_for == WaitingFor.CHECKPOINT else None,
        "final": task.is_final_view(),
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
        "createdAt": task.created_at.isoformat(),
        "startedAt": _iso(task.started_at),
        "finishedAt": _iso(task.finished_at),
        "historyPrunedAt": _iso(task.history_pruned_at),
        "updatedAt": task.updated_at.isoformat(),
        "next": next_calls(task),
    }
    return redact.redact(_jsonable(view))


def present_run(run: Run, redact: Redactor) -> RunView:
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
        "startedAt": _iso(run.started_at),
        "finishedAt": _iso(run.finished_at),
    }


def present_event(event: TaskEvent) -> Event:
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


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value

"""What the API's bodies look like, declared for ``/api/schema/``.

One serializer per body the API sends. The presenters (``*/presenters.py``) build the
bodies; these declarations describe them, and ``tests/api/test_schema.py`` holds the two
together by validating every endpoint's real responses against the served schema. Free-form
parts (a flow, facts, an event's data) are declared as objects and stay open.

Request bodies are declared where they are checked, as ``boxsite.core.validation.Body`` serializers
beside the code that uses them (the task spec in ``tasks.spec``): one declaration both checks a
body and describes it here.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import serializers as s

Str = s.CharField
Int = s.IntegerField
Bool = s.BooleanField
Obj = s.JSONField  # any JSON value (an object, as the field's description says)


def _strs(**kw: Any) -> s.ListField:
    return s.ListField(child=s.CharField(), **kw)


# --- tasks -------------------------------------------------------------------------------
class CreatedBy(s.Serializer):
    task = Str()
    run = Int(allow_null=True)


class TaskView(s.Serializer):
    id = Str()
    title = Str()
    prompt = Str(allow_blank=True)
    workspace = Str()
    worker = Str()
    command = _strs(allow_null=True)
    tools = _strs()
    hosts = _strs()
    budgetCents = Int()
    source = Str()  # type: ignore[assignment]  # a body field, not Field.source
    flow = Obj()
    facts = s.DictField(child=Str(allow_blank=True), help_text="secret values shown as ${name}")
    secretFacts = _strs()
    constraints = Obj()
    limits = s.DictField(child=Int(allow_null=True), help_text="every limit in force; null is unbounded")
    output = Obj()
    answer = Obj(help_text="a plain-language task's answer (the agent's finish), else null")
    result = Obj(help_text="with output: the answer shaped to output.schema from the task's records (else null)")
    folders = _strs()
    dependsOn = s.ListField(child=Obj(), help_text="{task, condition, required, artifact?} per dependency")
    criteria = s.ListField(child=Obj(), allow_null=True, help_text="the completion contract, or null")
    parent = Str(allow_null=True)  # type: ignore[assignment]  # a body field, not Field.parent
    createdBy = CreatedBy(allow_null=True, help_text="the task (and its run) that created this one, else null")
    state = s.ChoiceField(choices=["queued", "running", "waiting", "done", "failed", "cancelled", "undone"])
    waitingFor = Str(allow_null=True)
    continuable = Bool(allow_null=True)
    final = Bool()
    pause = Obj()
    version = Int()
    user = Str()
    layers = _strs()
    costCents = Int()
    spent = Obj()
    step = Obj()
    progress = s.FloatField(allow_null=True)
    error = Str(allow_null=True)
    recoverable = Bool(allow_null=True)
    hint = Str(allow_null=True)
    review = Str(allow_null=True)
    isolation = Obj()
    lastSeq = Int()
    externalTaskId = Str(allow_null=True)
    externalAttempt = Int(allow_null=True)
    createdAt = Str()
    startedAt = Str(allow_null=True)
    finishedAt = Str(allow_null=True)
    historyPrunedAt = Str(allow_null=True, help_text="when retention removed a done task's history; its layer stays")
    updatedAt = Str()
    next = _strs(help_text="the calls that make sense now: continue, approve, deny, keep, cancel, undo, diff, report")


class Artifact(s.Serializer):
    name = Str()
    type = Str()
    size = Int()
    url = Str()


class Event(s.Serializer):
    id = Int()
    seq = Int()
    kind = Str()
    summary = Str(allow_blank=True)
    data = Obj()  # type: ignore[assignment]  # a body field, not Serializer.data
    costCents = Int()
    artifacts = s.ListField(child=Obj(), allow_null=True)
    createdAt = Str()


class EventPage(s.Serializer):
    events = Event(many=True)
    after = Int()
    nextAfter = Int()
    more = Bool()


class TaskPage(s.Serializer):
    results = TaskView(many=True)
    next = Str(help_text="the cursor of the next page", allow_null=True)


class TaskSummary(s.Serializer):
    id = Str()
    title = Str()
    state = Str()
    waitingFor = Str(allow_null=True)
    version = Int()


class ApprovalView(s.Serializer):
    id = Int()
    task = Str()
    kind = Str()
    summary = Str(allow_blank=True)
    detail = Obj()
    guard = Obj()
    amountCents = Int()
    taskVersion = Int()
    state = Str()
    decidedBy = Str(allow_null=True)
    decidedVia = Str(allow_null=True)
    decidedAt = Str(allow_null=True)
    createdAt = Str()
    next = _strs()
    screenshot = Str(allow_null=True)  # the task's latest page image (an artifact URL), if any
    taskView = TaskSummary(required=False)


class QuestionView(s.Serializer):
    id = Int()
    task = Str()
    kind = Str()
    prompt = Str(allow_blank=True)
    fields = Obj()  # type: ignore[assignment]  # a body field, not Serializer.fields
    answer = Obj()
    state = Str()
    taskVersion = Int()
    answeredBy = Str(allow_null=True)
    answeredVia = Str(allow_null=True)
    answeredAt = Str(allow_null=True)
    createdAt = Str()
    next = _strs()
    screenshot = Str(allow_null=True)  # the task's latest page image (an artifact URL), if any
    taskView = TaskSummary(required=False)


class TaskDetail(TaskView):
    approvals = ApprovalView(many=True)
    questions = QuestionView(many=True)
    log = EventPage()


class TaskKept(TaskView):
    conflicts = _strs()


class Diff(s.Serializer):
    task = Str()
    added = _strs()
    modified = _strs()
    deleted = _strs()
    binary = _strs()
    special = s.ListField(child=Obj())
    diff = Str(allow_blank=True)
    truncated = Bool()


class Report(s.Serializer):
    view = TaskView()
    flow = Obj()
    steps = s.ListField(child=Obj())
    records = Obj()
    runs = s.ListField(child=Obj())
    approvals = ApprovalView(many=True)
    questions = QuestionView(many=True)
    rescues = s.ListField(child=Obj())
    memory = s.ListField(child=Obj())  # grounding hints learned: {instruction, page, selector}


class Inbox(s.Serializer):
    approvals = ApprovalView(many=True)
    questions = QuestionView(many=True)


class WorkspaceStack(s.Serializer):
    separate = _strs(help_text="layers a new task mounts on their own, newest first")
    compacted = _strs(help_text="layers a new task mounts inside flats, newest first")
    flats = Int(help_text="the flat layers those are merged into")
    depth = Int(help_text="the lower layers a new task mounts: the separate ones, the flats and the base")


class Workspace(s.Serializer):
    name = Str()
    createdAt = Str()
    driver = Str()
    layers = _strs()
    stack = WorkspaceStack()


class WorkspacePage(s.Serializer):
    results = Workspace(many=True)


class WorkspaceEntry(s.Serializer):
    workspace = Str()
    path = Str(allow_blank=True)
    type = s.ChoiceField(choices=["dir", "file", "link", "special"])


class Secret(s.Serializer):
    name = Str()
    createdAt = Str()
    updatedAt = Str()


class SecretList(s.Serializer):
    secrets = Secret(many=True)


class Tool(s.Serializer):
    name = Str()
    description = Str(allow_blank=True)
    schema = Obj()
    costCents = Int()
    irreversible = Bool()
    provider = Str()


class ToolList(s.Serializer):
    tools = Tool(many=True)


class Health(s.Serializer):
    ok = Bool()
    database = Str()
    queue = Str()
    live = Str()
    isolation = Obj()


# --- schedules and triggers ----------------------------------------------------------------
class Firing(s.Serializer):
    occurrence = Str(allow_null=True)
    firedAt = Str(allow_null=True)
    skipped = Int()
    skippedAtLeast = Bool()
    task = Str(allow_null=True)
    taskTitle = Str(allow_null=True)
    taskState = Str(allow_null=True)
    error = Str(allow_null=True)


class Schedule(s.Serializer):
    id = Int()
    name = Str()
    source = Str()  # type: ignore[assignment]  # a body field, not Field.source
    cron = Str(allow_null=True)
    timezone = Str(allow_null=True)
    intervalSeconds = Int(allow_null=True)
    cadence = Str()
    template = Obj()
    status = Str()
    enabled = Bool()
    paused = Bool()
    disabledReason = Str(allow_null=True)
    system = Bool()
    origin = Str()
    createdByDevice = Int(allow_null=True)
    createdByTask = Str(allow_null=True)
    createdByRun = Int(allow_null=True, help_text="the number of that task's run that created it")
    nextRunAt = Str(allow_null=True)
    lastRunAt = Str(allow_null=True)
    lastTask = Str(allow_null=True)
    lastFiring = Firing(allow_null=True)
    consecutiveFailures = Int()
    backoffUntil = Str(allow_null=True)
    needsAttention = Bool()
    lastError = Str(allow_null=True)
    version = Int()
    createdAt = Str()
    updatedAt = Str()


class SchedulePage(s.Serializer):
    results = Schedule(many=True)
    next = Str(allow_null=True)


class FiringList(s.Serializer):
    results = Firing(many=True)


class Trigger(s.Serializer):
    id = Int()
    name = Str()
    kind = s.ChoiceField(choices=["webhook", "file"])
    source = Str()  # type: ignore[assignment]  # a body field, not Field.source
    template = Obj()
    paused = Bool()
    origin = Str()
    createdByDevice = Int(allow_null=True)
    createdByTask = Str(allow_null=True)
    lastFiredAt = Str(allow_null=True)
    lastTask = Str(allow_null=True)
    createdAt = Str()
    updatedAt = Str()
    path = Str(required=False, help_text="webhook: where deliveries go")
    url = Str(required=False)
    rotating = Bool(required=False)
    previousSecretExpiresAt = Str(required=False, allow_null=True)
    folder = Str(required=False, help_text="file trigger: the watched folder")
    settleSeconds = s.FloatField(required=False)
    secret = Str(required=False, help_text="only when created or rotated: shown once")


class TriggerPage(s.Serializer):
    results = Trigger(many=True)
    next = Str(allow_null=True)


class Delivery(s.Serializer):
    delivery = Str()
    receivedAt = Str(allow_null=True)
    task = Str(allow_null=True)
    taskTitle = Str(allow_null=True)
    taskState = Str(allow_null=True)


class DeliveryList(s.Serializer):
    results = Delivery(many=True)


class WebhookReceived(s.Serializer):
    task = Str(allow_null=True)
    delivery = Str(allow_null=True)
    duplicate = Bool()


# --- account -------------------------------------------------------------------------------
class Settings(s.Serializer):
    defaultBudgetCents = Int()
    networkDefault = Str()
    defaultHosts = _strs()
    retentionDays = Int()
    retentionCount = Int(help_text="ended tasks whose history is kept (newest first)")
    maxActiveTasks = Int()
    taskMemoryMb = Int(help_text="a new task's memory limit (MB) when its spec sets none")
    taskCpuPercent = Int(help_text="a new task's CPU cap (% of one core) when its spec sets none")
    taskDiskMb = Int(help_text="what a new task may write to its layer (MB) when its spec sets none")
    tasksMayCreateWork = Bool(help_text="a running task may create child tasks and schedules through its broker")
    maxCreatedPerTask = Int(help_text="the most tasks and schedules one task may create")
    timeZone = Str(help_text="the owner's calendar (an IANA name), for the daily action count")
    maxActionsPerDay = Int(allow_null=True, help_text="reaching it tells the owner once a day; null: no maximum")
    actionsToday = Int(help_text="consequential actions attempted today, in timeZone")
    updatedAt = Str(allow_null=True)


class Token(s.Serializer):
    id = Int()
    name = Str()
    prefix = Str()
    canUseFolders = Bool()
    createdAt = Str(allow_null=True)
    lastUsedAt = Str(allow_null=True)
    revokedAt = Str(allow_null=True)


class NewToken(Token):
    token = Str(help_text="the token itself: shown this once")


class TokenPage(s.Serializer):
    results = Token(many=True)


class Device(s.Serializer):
    id = Int()
    name = Str()
    createdAt = Str(allow_null=True)
    lastSeenAt = Str(allow_null=True)
    revokedAt = Str(allow_null=True)


class DevicePage(s.Serializer):
    results = Device(many=True)


class Pairing(s.Serializer):
    code = Str()
    url = Str()
    expiresAt = Str(allow_null=True)
    qrSvg = Str()
    reachWarning = Str(allow_null=True, help_text="why a phone could not open the link, and the fix; null when it can")


class RunView(s.Serializer):
    number = Int()
    mode = s.ChoiceField(choices=["start", "resume", "retry", "repair"])
    attempt = Int(help_text="tries of the same resume point")
    state = s.ChoiceField(choices=["queued", "running", "finished", "lost", "cancelled"])
    outcome = Str(allow_null=True)
    error = Str(allow_null=True)
    charged = Bool(help_text="counted against the task's attempts (a wait for the owner is refunded)")
    usage = Obj(help_text="{elapsedMs}")
    createdAt = Str()
    startedAt = Str(allow_null=True)
    finishedAt = Str(allow_null=True)


class Attempts(s.Serializer):
    total = Int(help_text="runs that started")
    charged = Int(help_text="of those, the ones counted against the task")


class RunPage(s.Serializer):
    results = RunView(many=True)
    next = Str(allow_null=True)
    attempts = Attempts()


class ActionReconciliation(s.Serializer):
    answer = Str(help_text="happened, did_not_happen or fail")
    by = Str(allow_null=True)
    at = Str(allow_null=True)


class ActionView(s.Serializer):
    id = Int()
    kind = Str(help_text="tool (an irreversible tool) or http (an http step with stop_before)")
    target = Str(help_text="the tool's name, or the request's method and URL (redacted)")
    position = Str(help_text="where it stands in the task: step:N in a flow, call for a process's call")
    args = Obj(help_text="the call's arguments, redacted")
    idempotencyKey = Str(help_text="the same task, position and arguments give the same key")
    state = Str(help_text="proposed, approved, executing, succeeded, failed, unknown or cancelled")
    taskVersion = Int(help_text="the task's version when it was proposed")
    policy = Obj(help_text="what let it through, as it stood when proposed")
    run = Int(allow_null=True, help_text="the number of the run that proposed or attempted it")
    approval = Int(allow_null=True)
    attemptedAt = Str(allow_null=True)
    settledAt = Str(allow_null=True)
    receipt = Obj(allow_null=True, help_text="a confirmed outcome: status, size, digest, an excerpt (redacted)")
    error = Str(allow_null=True)
    reconciliation = ActionReconciliation(allow_null=True, help_text="the owner's word on an unknown outcome")
    createdAt = Str()


class ActionPage(s.Serializer):
    results = ActionView(many=True)
    next = Str(allow_null=True)


class DependencyEdge(s.Serializer):
    task = Str()
    title = Str()
    state = Str(help_text="the other task's state")
    condition = s.ChoiceField(choices=["success", "completion", "artifact"])
    required = Bool()  # type: ignore[assignment]  # a body field, not Field.required
    artifact = Str(required=False)
    edge = s.ChoiceField(choices=["waiting", "satisfied", "unsatisfied"])


class DependencyGraph(s.Serializer):
    dependencies = DependencyEdge(many=True, help_text="the tasks this one waits for")
    dependents = DependencyEdge(many=True, help_text="the tasks that wait for this one")


# --- request bodies --------------------------------------------------------------------------

class DependencyBody(s.Serializer):
    task = Str(help_text="the task to wait for")
    condition = s.ChoiceField(choices=["success", "completion", "artifact"], required=False, default="success")
    required = Bool(required=False, default=True)  # type: ignore[assignment]  # a body field, not Field.required
    artifact = Str(required=False, help_text="for 'artifact': the file under outputs/ the dependency must leave")
class BearerAuth(OpenApiAuthenticationExtension):
    target_class = "boxsite.core.auth.BearerTokenAuthentication"
    name = "bearer"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}


class DeviceCookieAuth(OpenApiAuthenticationExtension):
    target_class = "boxsite.core.auth.DeviceCookieAuthentication"
    name = "device"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "box_device"}


ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "stable error code, e.g. INVALID_SPEC, NOT_FOUND, CONFLICT"},
        "message": {"type": "string"},
        "field": {"type": ["string", "null"], "description": "the request field at fault, dotted, or null"},
        "reference": {"type": "string", "description": "500 only: the id the box's log has the details under"},
    },
    "required": ["code", "message", "field"],
}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Every operation may answer an error, always in one shape: declare it once, as default."""
    result.setdefault("components", {}).setdefault("schemas", {})["ErrorBody"] = ERROR_SCHEMA
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            operation.setdefault("responses", {})["default"] = {
                "description": "an error, in the API's error shape",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
            }
    return result


# --- the model ---------------------------------------------------------------------------
class ModelSettings(s.Serializer):
    configured = Bool(help_text="a base URL and a model name are set (here or in the environment)")
    baseUrl = Str(allow_blank=True)
    model = Str(allow_blank=True)
    keyName = Str(allow_blank=True, help_text="the vault secret holding the API key; empty: the endpoint takes none")
    keySet = Bool(help_text="the vault holds keyName")
    inputCentsPerMillion = s.FloatField()
    outputCentsPerMillion = s.FloatField()
    fromEnvironment = _strs(help_text="fields whose value comes from a BOX_MODEL_* variable, not from these settings")


class ModelTest(s.Serializer):
    ok = Bool()
    answer = Str(required=False)
    error = Str(required=False)
    kind = Str(required=False, help_text="what went wrong: key, unreachable, timeout, status, garbage, config")
    usage = Obj(required=False)
    latencyMs = Int(required=False)
    costCents = s.FloatField(required=False)


class Describe(s.Serializer):
    flowLanguage = _strs()
    commonKeys = Obj()
    steps = Obj(help_text="per step kind: acts, what, and a JSON Schema of the step")
    examples = s.ListField(child=Obj())
    howToStart = Str()

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import models

from boxsite.core.principal import Principal, Via
from tasks.ids import new_task_id
from tasks.spec.limits import default_limit
from tasks.states import FINAL, Review, State, WaitingFor


def _empty_spent() -> dict[str, int]:
    return {"actions": 0, "model_calls": 0, "elapsed_ms": 0, "rescues": 0}


class Workspace(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    base_dir = models.CharField(max_length=1024)
    created_at = models.DateTimeField(auto_now_add=True)
    # Several machines (``BOX_MACHINE``): the machine whose disk holds the workspace and runs its
    # tasks ('' until a machine first uses it; always '' on one machine), and while its layers are
    # copied to another, that one (its tasks wait meanwhile; ``tasks.machines``).
    machine = models.CharField(max_length=32, blank=True, default="")
    moving_to = models.CharField(max_length=32, blank=True, default="")
    moving_since = models.DateTimeField(null=True, blank=True)
    # The owner gave up the layers on a gone machine (``moves.ask_abandon``): the move starts the
    # workspace afresh instead of copying, and marks what was lost.
    moving_lost = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.name

    def base_path(self) -> Path:
        """The base directory; a relative ``base_dir`` is under ``BOX_DATA_DIR/workspaces``."""
        path = Path(self.base_dir)
        if not path.is_absolute():
            path = Path(settings.BOX_DATA_DIR) / "workspaces" / path
        return path


class TaskQuerySet(models.QuerySet["Task"]):
    """The one access rule (docs/internals/decisions.md#foundation, "Who may see and act on a task").

    The owner, signed in or with an API token, reaches every task of theirs; so does the box
    acting for them (schedules, triggers). A running task creating work (``tasks.tools.delegation``)
    reaches itself and the tasks it created. A paired phone reaches the tasks it started, never a
    folder task; beyond those it answers the approvals and questions of its inbox.
    """

    def reachable_by(self, principal: Principal) -> TaskQuerySet:
        """The tasks ``principal`` may open, follow and act on (cancel, undo, continue, report)."""
        mine = self.filter(owner=principal.user)
        if principal.via == Via.DEVICE:
            return mine.filter(device=principal.device, folders=[])
        if principal.via == Via.TASK:
            return mine.filter(models.Q(pk=principal.task.pk) | models.Q(created_by_task=principal.task))
        return mine

    def listed_for(self, principal: Principal) -> TaskQuerySet:
        """The tasks in ``principal``'s lists (the list API, the list stream, the pages): exactly
        those it may reach, so a list never shows what opening would refuse."""
        return self.reachable_by(principal)

    def inbox_of(self, principal: Principal) -> TaskQuerySet:
        """The tasks whose pending approvals and open questions ``principal`` may see and answer:
        the owner's; a paired phone's inbox leaves out folder tasks."""
        mine = self.filter(owner=principal.user)
        if principal.via == Via.DEVICE:
            return mine.filter(folders=[])
        return mine


class Task(models.Model):
    id = models.CharField(primary_key=True, max_length=24, default=new_task_id, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tasks")
    device = models.ForeignKey("boxsite.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks")

    # --- the spec ---
    title = models.CharField(max_length=200)
    prompt = models.TextField(blank=True)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="tasks")
    worker = models.CharField(max_length=64)
    command = models.JSONField(null=True, blank=True)
    tools = models.JSONField(default=list)
    hosts = models.JSONField(default=list)
    budget_cents = models.PositiveIntegerField(default=0)
    source = models.CharField(max_length=200, default="api")
    flow = models.JSONField(null=True, blank=True)
    facts = models.JSONField(default=dict)
    secret_facts = models.JSONField(default=list)
    vault_secrets = models.JSONField(default=list)  # vault names the task may use as ${NAME}, like secret facts
    constraints = models.JSONField(default=dict)
    limits = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    criteria = models.JSONField(null=True, blank=True)  # the completion contract (tasks.run.completion)
    notify = models.JSONField(default=dict, blank=True)  # what the owner asked to be told of besides waits and failures
    folders = models.JSONField(default=list)
    # Several machines: a folder task runs on the machine that has its folders, the one that
    # made the task ('' otherwise: its workspace's machine).
    machine = models.CharField(max_length=32, blank=True, default="")
    depends_on = models.JSONField(default=list)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="subtasks")
    # Provenance of a task a running task created through its broker (tasks.tools.delegation): that
    # task (also its ``parent``) and the number of the run that asked.
    created_by_task = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="created_tasks")
    created_by_run = models.PositiveIntegerField(null=True, blank=True)
    external_task_id = models.CharField(max_length=200, blank=True)
    external_attempt = models.PositiveIntegerField(null=True, blank=True)

    # --- what the box keeps ---
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    waiting_for = models.CharField(max_length=16, choices=WaitingFor.choices, blank=True)
    continuable = models.BooleanField(default=True)
    pause = models.JSONField(default=dict, blank=True)  # what the pause asks for (message, fields)
    resume = models.JSONField(default=dict, blank=True)  # where the next run picks up
    version = models.PositiveIntegerField(default=1)
    user = models.CharField(max_length=64, blank=True)
    layers = models.JSONField(default=list)
    cost_cents = models.PositiveIntegerField(default=0)
    spent = models.JSONField(default=_empty_spent)
    step = models.CharField(max_length=500, blank=True)
    progress = models.FloatField(default=0.0)
    records = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    recoverable = models.BooleanField(null=True, blank=True)
    hint = models.TextField(blank=True)
    review = models.CharField(max_length=16, blank=True, choices=Review.choices)  # moves: states.REVIEW_MOVES
    isolation = models.CharField(max_length=200, blank=True)
    event_seq = models.PositiveIntegerField(default=0)  # the last seq handed out; gapless

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # set when retention removed a done task's history (log, runs, files); its layer stays
    history_pruned_at = models.DateTimeField(null=True, blank=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["owner", "-created_at", "-id"], name="task_owner_recent"),
            models.Index(fields=["state"], name="task_state"),
            models.Index(fields=["source"], name="task_source"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.title!r} ({self.state})"

    def is_final(self) -> bool:
        return self.state in FINAL

    def is_final_view(self) -> bool:
        """Final for a caller: a final state, or a checkpoint that cannot be continued (a payment
        page: a person finishes it outside the box, and only cancel or undo releases what the task
        holds)."""
        return self.is_final() or (self.state == State.WAITING and self.waiting_for == WaitingFor.CHECKPOINT
                                   and not self.continuable)

    def limit(self, name: str) -> int | None:
        """The task's limit for ``name`` (its own, else the default); None means unbounded."""
        value: Any = self.limits.get(name, default_limit(name))
        return None if value is None else int(value)


class Condition(models.TextChoices):
    """When a dependency edge is satisfied (``tasks.dependencies``)."""

    SUCCESS = "success"  # the dependency is done
    COMPLETION = "completion"  # the dependency reached any final state
    ARTIFACT = "artifact"  # the dependency is done and its layer holds the named file


class Dependency(models.Model):
    """An edge: ``task`` starts only once ``on`` satisfies ``condition`` (when ``required``), or
    once ``on`` has ended at all (when not). Added only by ``tasks.dependencies.add_edge``, which
    refuses cycles."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="dependency_edges")
    on = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="dependent_edges")
    condition = models.CharField(max_length=16, choices=Condition.choices, default=Condition.SUCCESS)
    artifact = models.CharField(max_length=1024, blank=True)  # the file an ``artifact`` edge needs
    required = models.BooleanField(default=True)
    # A recovery review's edge (tasks.dependencies.recover): the failed edge it replaces, and the
    # version of the failed dependency it was created for. One review per failed edge.
    recovers = models.OneToOneField("self", null=True, blank=True, on_delete=models.CASCADE, related_name="recovery")
    recovers_version = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "on"], name="dependency_task_on_unique")]


class EventKind(models.TextChoices):
    STATUS = "status"
    STEP = "step"
    STEP_RESULT = "step_result"  # what a step did (tasks.run.evidence), logged before the next begins
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    COST = "cost"
    BLOCKED_CONNECTION = "blocked_connection"
    APPROVAL = "approval"
    QUESTION = "question"
    OUTPUT = "output"
    ERROR = "error"
    NOTE = "note"


class TaskEvent(models.Model):
    """One line of the action log. ``seq`` is gapless per task; ``id`` is global."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    summary = models.TextField()
    data = models.JSONField(default=dict)
    cost_cents = models.PositiveIntegerField(default=0)
    artifacts = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "seq"], name="event_task_seq_unique")]
        ordering = ["task", "seq"]


class RunKind(models.TextChoices):
    START = "start"
    RESUME = "resume"
    RETRY = "retry"
    REPAIR = "repair"


class RunState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    LOST = "lost"
    CANCELLED = "cancelled"


class Run(models.Model):
    """One attempt at a task. Immutable once finished, lost or cancelled."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="runs")
    number = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=RunKind.choices)
    attempt = models.PositiveIntegerField(default=1)  # tries of the same resume point
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    resume = models.JSONField(default=dict, blank=True)
    lease_token = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker_host = models.CharField(max_length=255, blank=True)
    worker_pid = models.PositiveIntegerField(null=True, blank=True)
    available_at = models.DateTimeField()
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    # counted against the task's attempts: false when the run ended to wait for the owner, was
    # superseded, or was handed back by a stopping box (those waits are refunded)
    charged = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "number"], name="run_task_number_unique")]
        indexes = [
            models.Index(fields=["state", "lease_expires_at"], name="run_state_lease"),
            models.Index(fields=["state", "available_at"], name="run_state_available"),
        ]


class LayerState(models.TextChoices):
    ACTIVE = "active"
    APPLIED = "applied"
    FAILED = "failed"
    DISCARDED = "discarded"


class Layer(models.Model):
    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="layer")
    # None for a folder task: its layer lies over the owner's folders, not a workspace
    workspace = models.ForeignKey(Workspace, null=True, blank=True, on_delete=models.CASCADE, related_name="layer_rows")
    driver = models.CharField(max_length=16)
    path = models.CharField(max_length=1024)
    state = models.CharField(max_length=16, choices=LayerState.choices, default=LayerState.ACTIVE)
    manifest = models.JSONField(default=dict, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The seal found layers applied while the task ran: its override note is still to be written
    # (``task_view.note_overrides``, after the seal's lock). Set with the manifest, cleared with
    # the note's event; one a crash left set is written by reconcile (at start-up) or hourly.
    note_due = models.BooleanField(default=False)
    # The layer's seal is complete (its meta says sealed), as the database knows it: set in the
    # seal's manifest update, cleared when a retry makes the layer active again. A start leaves
    # an applied layer that is not sealed out of its stack when its task finished after the
    # start's task was created, unless it depends on that task (``stack_record.record_layer``).
    sealed = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["note_due"], condition=models.Q(note_due=True), name="layer_note_due"),
            # Every start reads its workspace's applied layers newest first (its stack), and every
            # seal those applied since its task was created: an index range, not a scan and a
            # sort of every layer the workspace ever had.
            models.Index(fields=["workspace", "state", "applied_at"], name="layer_workspace_applied"),
        ]


class VaultSecret(models.Model):
    """A secret encrypted at rest (Fernet, ``tasks.vault.crypto``); written only by ``tasks.vault``.
    The API never returns ``ciphertext`` or its value."""

    name = models.CharField(max_length=128, unique=True)
    ciphertext = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "boxsite_vaultsecret"  # the table it had in the boxsite app; moved without a copy


class GroundingEntry(models.Model):
    """What a ``describe`` target turned out to be on one page, for the next run of the same
    instruction (``tasks.browser.cache``): written only by that module, after the action on the
    element succeeded. One per owner, workspace, page (origin and path) and instruction."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="grounding_entries")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="grounding_entries")
    origin = models.CharField(max_length=300)
    path = models.CharField(max_length=1000)
    instruction = models.CharField(max_length=500)
    # sha256 of origin, path and instruction: the unique key stays small whatever their lengths
    key = models.CharField(max_length=64)
    kind = models.CharField(max_length=16)  # the step that acted: click or fill
    selector = models.CharField(max_length=2000)  # a Playwright selector: role and name first, a CSS path last
    fingerprint = models.JSONField(default=dict)  # role, name, text, label, row, heading (redacted)
    task_id = models.CharField(max_length=24, blank=True)  # the task whose action confirmed it last
    grounded_at = models.DateTimeField()  # when the model chose it: its age, for BOX_GROUNDING_CACHE_DAYS
    used_at = models.DateTimeField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0)  # replays that verified and acted with no model call

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "workspace", "key"],
                                               name="grounding_entry_key_unique")]
        indexes = [models.Index(fields=["owner", "-grounded_at"], name="grounding_owner_recent")]


class Machine(models.Model):
    """A machine of a box of several (``BOX_MACHINE``): where its web process answers the others
    (``url``), and when its worker cluster last said it is alive. Written by its cluster leader
    every ``BOX_BEAT_S``; one machine has no row."""

    name = models.CharField(primary_key=True, max_length=32)
    url = models.CharField(max_length=300)
    beat_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name

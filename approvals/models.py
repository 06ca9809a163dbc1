from __future__ import annotations

from django.conf import settings
from django.db import models

# The kinds and states are the words tasks and approvals share: they live with the interface
# tasks declares (tasks.pauses), and are the choices of the fields here.
from tasks.pauses import ActionKind, ActionState, ApprovalKind, ApprovalState, QuestionKind, QuestionState


class Approval(models.Model):
    """The owner's OK for exactly one guarded step, bound to the task version it was asked at."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(max_length=16, choices=ApprovalKind.choices)
    summary = models.CharField(max_length=500)
    detail = models.JSONField(default=dict, blank=True)  # redacted
    guard = models.JSONField(default=dict, blank=True)  # the exact step/action this approves
    amount_cents = models.PositiveIntegerField(default=0)  # spending approvals: how much more
    task_version = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=ApprovalState.choices, default=ApprovalState.PENDING)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    decided_via = models.CharField(max_length=32, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["state", "created_at"], name="approval_state_created")]


class SpentLink(models.Model):
    """A signed approve or deny link (``approvals.links``) that was used: a link works once."""

    nonce = models.CharField(max_length=32, primary_key=True)
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="spent_links")
    spent_at = models.DateTimeField(auto_now_add=True)


class Question(models.Model):
    """A blocker in the human inbox: staged during a run, opened when the run ends waiting."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="questions")
    run = models.ForeignKey("tasks.Run", null=True, blank=True, on_delete=models.SET_NULL)
    kind = models.CharField(max_length=16, choices=QuestionKind.choices)
    prompt = models.CharField(max_length=500, blank=True)
    fields = models.JSONField(default=list)  # [{name, why, kind, options}]
    answer = models.JSONField(null=True, blank=True)  # redacted
    state = models.CharField(max_length=16, choices=QuestionState.choices, default=QuestionState.STAGED)
    task_version = models.PositiveIntegerField(default=0)
    answered_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    answered_via = models.CharField(max_length=32, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["state", "created_at"], name="question_state_created")]


# An action in these states has not reached its provider: cancelling the task cancels it.
NOT_STARTED = (ActionState.PROPOSED, ActionState.APPROVED)


class Reconciliation(models.TextChoices):
    """The owner's word on an action whose outcome the box does not know."""

    HAPPENED = "happened"
    NOT_HAPPENED = "did_not_happen"
    FAIL = "fail"


class Action(models.Model):
    """A consequential call: proposed, approved (or allowed by policy), attempted at most once
    under the run's lease, settled with a redacted receipt, or ``unknown`` until the owner says
    what happened. Its ``idempotency_key`` (task, position, real arguments) is what a resumed run
    finds it by; ``approvals.actions`` is the only writer."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="actions")
    run = models.ForeignKey("tasks.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=8, choices=ActionKind.choices, default=ActionKind.TOOL)
    tool = models.CharField(max_length=500)  # the tool's name, or "POST https://..." (redacted)
    position = models.CharField(max_length=64, default="")  # "step:3" in a flow, "call" for a process's call
    args = models.JSONField(default=dict)  # redacted
    idempotency_key = models.CharField(max_length=128, unique=True)
    task_version = models.PositiveIntegerField(default=0)
    policy = models.JSONField(default=dict)  # what allowed it, as it stood when proposed
    approval = models.ForeignKey(Approval, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    question = models.ForeignKey(Question, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    state = models.CharField(max_length=24, choices=ActionState.choices, default=ActionState.PROPOSED)
    # The fence of the attempt: the run and its lease token when the call was let through.
    lease_token = models.CharField(max_length=64, blank=True)
    attempted_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    receipt = models.JSONField(null=True, blank=True)  # redacted; confirmed outcomes only
    error = models.CharField(max_length=500, blank=True)
    reconciliation = models.CharField(max_length=16, choices=Reconciliation.choices, blank=True)
    reconciled_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+")
    reconciled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["task", "state"], name="action_task_state"),
                   # a task's actions in the API's order: each page seeks to its cursor
                   models.Index(fields=["task", "created_at", "id"], name="action_task_created")]


class ActionDay(models.Model):
    """How many actions the box attempted on one day of the owner's calendar, and whether the
    owner was told that the day reached its maximum (once a day)."""

    day = models.DateField(unique=True)
    count = models.PositiveIntegerField(default=0)
    notified_at = models.DateTimeField(null=True, blank=True)

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApprovalKind(models.TextChoices):
    IRREVERSIBLE = "irreversible"
    SPENDING = "spending"
    ACTION = "action"
    PAYMENT = "payment"
    CHECKPOINT = "checkpoint"


class ApprovalState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    STALE = "stale"
    EXPIRED = "expired"


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


class QuestionKind(models.TextChoices):
    INPUT = "input"
    HUMAN = "human"
    REPAIR = "repair"
    REPLAN = "replan"
    TEXT = "text"


class QuestionState(models.TextChoices):
    STAGED = "staged"
    OPEN = "open"
    ANSWERED = "answered"
    CANCELLED = "cancelled"


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


class ActionState(models.TextChoices):
    PROPOSED = "proposed"
    AWAITING_APPROVAL = "awaiting_approval"
    LEASED = "leased"
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"


class Action(models.Model):
    """A consequential tool call: attempted once, its receipt kept, never replayed blindly."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="actions")
    tool = models.CharField(max_length=128)
    args = models.JSONField(default=dict)  # redacted
    idempotency_key = models.CharField(max_length=128, unique=True)
    state = models.CharField(max_length=24, choices=ActionState.choices, default=ActionState.PROPOSED)
    receipt = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

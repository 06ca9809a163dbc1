"""Schedules and triggers (docs/guide/schedules.md): fields and read-only questions. Changes live in services."""
from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q

from schedules.cadence import Cadence


class Origin(models.TextChoices):
    """Who created a schedule or trigger (its provenance)."""

    OWNER = "owner"  # the owner: the portal session or an API token
    DEVICE = "device"  # a paired phone
    TASK = "task"  # a task, through the broker
    SYSTEM = "system"  # built into the box


class ScheduleStatus(models.TextChoices):
    """Derived from the flags, for lists and filters (not stored)."""

    ACTIVE = "active"
    PAUSED = "paused"
    DISABLED = "disabled"
    ATTENTION = "attention"


class Schedule(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules")
    name = models.SlugField(max_length=100)
    cron = models.CharField(max_length=200, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    template = models.JSONField()  # a task spec, checked when saved and again when it fires

    # The cursor: the next occurrence owed. NULL while paused or disabled.
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    enabled = models.BooleanField(default=True)  # False once the box disabled it after failures
    disabled_reason = models.TextField(blank=True)
    paused = models.BooleanField(default=False)
    system = models.BooleanField(default=False)
    consecutive_failures = models.PositiveIntegerField(default=0)
    backoff_until = models.DateTimeField(null=True, blank=True)
    needs_attention = models.BooleanField(default=False)
    last_error = models.TextField(blank=True)

    created_via = models.CharField(max_length=16, choices=Origin.choices, default=Origin.OWNER)
    created_by_device = models.ForeignKey("boxsite.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_run = models.PositiveIntegerField(null=True, blank=True)  # the run of created_by_task that asked
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="schedule_owner_name_unique"),
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_seconds__isnull=False)) | (~Q(cron="") & Q(interval_seconds__isnull=True)),
                name="schedule_one_cadence",
            ),
        ]
        indexes = [models.Index(fields=["enabled", "paused", "next_run_at"], name="schedule_due")]

    def __str__(self) -> str:
        return f"schedule {self.name}"

    @property
    def cadence(self) -> Cadence:
        return Cadence(cron=self.cron, timezone=self.timezone, interval_seconds=self.interval_seconds)

    @property
    def source(self) -> str:
        return f"schedule:{self.name}"

    def status(self) -> str:
        if not self.enabled:
            return ScheduleStatus.DISABLED
        if self.paused:
            return ScheduleStatus.PAUSED
        if self.needs_attention:
            return ScheduleStatus.ATTENTION
        return ScheduleStatus.ACTIVE


class Firing(models.Model):
    """One firing of a schedule (on time or a catch-up), successful or not."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    occurrence = models.DateTimeField()  # the occurrence owed (the cursor when it fired)
    fired_at = models.DateTimeField()
    skipped = models.PositiveIntegerField(default=0)  # missed occurrences folded into this one
    skipped_at_least = models.BooleanField(default=False)  # the count hit the counting bound
    task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error = models.TextField(blank=True)

    class Meta:
        indexes = [models.Index(fields=["schedule", "-id"], name="firing_schedule_recent")]


class TriggerKind(models.TextChoices):
    WEBHOOK = "webhook"
    FILE = "file"


class Trigger(models.Model):
    """A webhook (URL token + signing secret) or a watched folder that starts tasks."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="triggers")
    name = models.SlugField(max_length=100)
    kind = models.CharField(max_length=16, choices=TriggerKind.choices)
    template = models.JSONField()
    paused = models.BooleanField(default=False)

    # webhook: the URL token (a capability, shown to the owner) and the secrets, encrypted (not
    # hashed) because verifying an HMAC needs the key itself.
    token = models.CharField(max_length=64, unique=True, null=True, blank=True)
    secret_ciphertext = models.BinaryField(null=True, blank=True)
    previous_secret_ciphertext = models.BinaryField(null=True, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    # file: the folder watched, and how long a file's size+mtime must stay still.
    folder = models.CharField(max_length=1024, blank=True)
    settle_seconds = models.FloatField(default=2.0)
    # Several machines (``BOX_MACHINE``): the machine whose disk has the folder (the one whose web
    # process named it), the only one that scans it; '' on one machine.
    machine = models.CharField(max_length=32, blank=True, default="")

    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_via = models.CharField(max_length=16, choices=Origin.choices, default=Origin.OWNER)
    created_by_device = models.ForeignKey("boxsite.Device", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="trigger_owner_name_unique")]
        indexes = [models.Index(fields=["kind", "paused"], name="trigger_kind_paused")]

    def __str__(self) -> str:
        return f"{self.kind} trigger {self.name}"

    @property
    def source(self) -> str:
        return f"{self.kind}:{self.name}"

    def rotating(self, now: datetime) -> bool:
        return self.previous_secret_ciphertext is not None and (
            self.previous_secret_expires_at is None or self.previous_secret_expires_at > now
        )


class Delivery(models.Model):
    """A webhook delivery id already acted on. The unique constraint makes replays harmless,
    even when two copies of the same delivery arrive at once."""

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.CharField(max_length=200)
    task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trigger", "delivery_id"], name="delivery_trigger_id_unique")]


class SeenState(models.TextChoices):
    SETTLING = "settling"  # seen once; fires when a later scan finds the same size and mtime
    STARTED = "started"  # a task was started for exactly this (path, size, mtime)


class SeenFile(models.Model):
    """A file a file-arrival trigger has seen. (trigger, path, size, mtime) is unique, so the
    same file never starts a second task, across scans, scanners and restarts."""

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="seen_files")
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField()
    mtime_ns = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=SeenState.choices, default=SeenState.SETTLING)
    task = models.ForeignKey("tasks.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    first_seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trigger", "path", "size", "mtime_ns"], name="seenfile_identity_unique"),
        ]

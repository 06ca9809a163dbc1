from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from boxsite.core import reads, sql


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for programs. Only its hash is stored; the token is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    can_use_folders = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)


class Device(models.Model):
    """A paired phone. It holds a revocable token in a secure cookie and may do what a device may."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)


class PushSubscription(models.Model):
    """Where a browser's push service takes the box's Web Push for it (``boxsite.push``): a
    paired phone's (``device``) or the owner's signed-in browser's. The keys encrypt each
    message for that browser alone; the endpoint is its push service's capability URL."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions")
    # A revoked phone's subscriptions are deleted with the revocation (``boxsite.services``).
    device = models.ForeignKey(Device, null=True, blank=True, on_delete=models.CASCADE, related_name="push_subscriptions")
    endpoint = models.URLField(max_length=2000, unique=True)
    p256dh = models.CharField(max_length=200)  # the browser's P-256 public key, base64url
    auth = models.CharField(max_length=64)  # its authentication secret, base64url
    created_at = models.DateTimeField(auto_now_add=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)


class PairingCode(models.Model):
    """A one-time code shown in settings (QR and short form) that pairs one phone."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    code_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)


class IdempotencyKey(models.Model):
    """A creation made under an ``Idempotency-Key`` header (``boxsite.core.idempotency``): a repeat
    of it by the same caller answers with the object it made. Written in the transaction that
    creates the object, so a key is only ever taken by a creation that happened."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    caller = models.CharField(max_length=80)  # the credential: one token's keys are not another's
    operation = models.CharField(max_length=80)  # "POST /api/tasks"
    key = models.CharField(max_length=255)
    body_digest = models.CharField(max_length=64)  # sha256 of the canonical JSON body
    result_id = models.CharField(max_length=64, blank=True)  # the created object's id
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["caller", "operation", "key"], name="idempotency_key_once")]


class NetworkDefault(models.TextChoices):
    NONE = "none"
    ALLOWLIST = "allowlist"


class BoxSettings(models.Model):
    """The owner's defaults. One row (pk=1); read with ``BoxSettings.current()``."""

    default_budget_cents = models.PositiveIntegerField(default=0)
    network_default = models.CharField(max_length=16, choices=NetworkDefault.choices, default=NetworkDefault.NONE)
    default_hosts = models.JSONField(default=list, blank=True)
    retention_days = models.PositiveIntegerField(default=30)
    retention_count = models.PositiveIntegerField(default=1000)  # ended tasks whose history is kept
    max_active_tasks = models.PositiveIntegerField(default=32)
    # Each new task's resource limits when its spec sets none; null: the environment's default
    # (BOX_TASK_MEMORY_MB, BOX_TASK_CPU_PERCENT).
    task_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    task_cpu_percent = models.PositiveIntegerField(null=True, blank=True)
    task_disk_mb = models.PositiveIntegerField(null=True, blank=True)  # BOX_TASK_DISK_MB until set
    # The model (tasks.llm.client.current_config); null/blank: the environment's BOX_MODEL_* value.
    model_base_url = models.CharField(max_length=500, blank=True)
    model_name = models.CharField(max_length=200, blank=True)
    model_key_name = models.CharField(max_length=128, null=True, blank=True)  # "" = no key
    model_input_cents_per_million = models.FloatField(null=True, blank=True)
    model_output_cents_per_million = models.FloatField(null=True, blank=True)
    model_cached_input_cents_per_million = models.FloatField(null=True, blank=True)
    model_reasoning_effort = models.CharField(max_length=16, null=True, blank=True)  # "" = none sent
    model_context_tokens = models.PositiveIntegerField(null=True, blank=True)  # BOX_MODEL_CONTEXT_TOKENS until set
    # Whether a running task may create child tasks and schedules through its broker
    # (tasks.tools.delegation), and how many one task may create in all.
    tasks_may_create_work = models.BooleanField(default=False)
    max_created_per_task = models.PositiveIntegerField(default=5)
    # The owner's calendar (an IANA name) and the most consequential actions a day of it should
    # see: reaching it tells the owner once that day; it never stops an action. Null: no maximum.
    time_zone = models.CharField(max_length=64, default="UTC")
    max_actions_per_day = models.PositiveIntegerField(null=True, blank=True)
    # Settings → Notifications: Apprise URLs, one a line, encrypted like vault secrets (they carry tokens).
    notify_urls_sealed = models.BinaryField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    @classmethod
    def current(cls) -> BoxSettings:
        """The row; read once per request or task creation (``boxsite.core.reads``)."""
        return reads.held("box_settings", lambda: cls.objects.get_or_create(pk=1)[0])

    @classmethod
    def locked(cls) -> BoxSettings:
        """The row, locked until the transaction ends (PostgreSQL; SQLite's write transaction
        holds the whole database). Every task creation asks (``sql.locked_row``); the row is
        made by the ORM only the first time."""
        row = sql.locked_row(cls, 1)
        if row is None:
            return cls.objects.select_for_update().get_or_create(pk=1)[0]
        return row

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        reads.keep("box_settings", self)

    @property
    def memory_mb_in_force(self) -> int:
        return self.resource_default("memory_mb")

    @property
    def cpu_percent_in_force(self) -> int:
        return self.resource_default("cpu_percent")

    @property
    def disk_mb_in_force(self) -> int:
        return self.resource_default("disk_mb")

    def resource_default(self, name: str) -> int:
        """A new task's ``memory_mb``, ``cpu_percent`` or ``disk_mb``: the owner's setting, else the env's."""
        if name == "memory_mb":
            return self.task_memory_mb or int(settings.BOX_TASK_MEMORY_MB)
        if name == "cpu_percent":
            return self.task_cpu_percent or int(settings.BOX_TASK_CPU_PERCENT)
        if name == "disk_mb":  # 0: no default (BOX_TASK_DISK_MB=0 and not set here)
            return self.task_disk_mb or int(settings.BOX_TASK_DISK_MB)
        raise ValueError(f"not a resource limit: {name}")

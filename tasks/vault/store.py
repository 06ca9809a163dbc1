"""The vault: named secrets (model API keys, preset and tool keys), encrypted at rest.

Values go in through ``set_secret`` and come out only to the box itself (``read_secret``: preset
environments, command tools). The API lists names and dates, never values.
"""
from __future__ import annotations

import re

from django.db import transaction

from boxsite.core import reads
from boxsite.core.errors import InvalidRequest, NotFound
from boxsite.models import BoxSettings
from tasks.models import Task, VaultSecret
from tasks.vault import crypto
from tasks.vault.facts import VAULT_READ, resealed, sealed_on_old_keys

# Secrets become environment variables of the same name, so names are valid variable names.
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_VALUE = 64 * 1024
# The kind of an input field that asks the owner for a missing vault key: its answer is stored
# in the vault (approvals.services), never in the task's facts or the log.
VAULT_FIELD = "vault"


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidRequest("a vault name is letters, digits and _ (not starting with a digit), at most 128", field="name")
    return name


def set_secret(name: object, value: object) -> VaultSecret:
    """Store (or replace) a secret, encrypted under the current key."""
    name = validate_name(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest("'value' must be a non-empty string", field="value")
    if len(value) > MAX_VALUE:
        raise InvalidRequest(f"'value' is longer than {MAX_VALUE} characters", field="value")
    row, _ = VaultSecret.objects.update_or_create(name=name, defaults={"ciphertext": crypto.encrypt(value)})
    reads.forget(VAULT_READ)
    return row


def read_secret(name: str) -> str | None:
    row = VaultSecret.objects.filter(name=name).first()
    if row is None:
        return None
    return crypto.decrypt(bytes(row.ciphertext))


def delete_secret(name: str) -> None:
    deleted, _ = VaultSecret.objects.filter(name=validate_name(name)).delete()
    reads.forget(VAULT_READ)
    if not deleted:
        raise NotFound(f"the vault has no '{name}'", field="name")


def rotate() -> int:
    """Re-encrypt every secret under the first key: vault rows and the secret facts sealed in
    tasks (same key). Returns how many values were rewritten.

    Each row is locked while it is rewritten, so a concurrent write is not overwritten with the
    old value.
    """

    count = 0
    for secret_id in list(VaultSecret.objects.values_list("pk", flat=True)):
        with transaction.atomic():
            row = VaultSecret.objects.select_for_update().filter(pk=secret_id).first()
            if row is None:
                continue  # deleted meanwhile
            VaultSecret.objects.filter(pk=secret_id).update(ciphertext=crypto.reencrypt(bytes(row.ciphertext)))
            count += 1
    with transaction.atomic():  # Settings → Notifications' URLs, sealed with the same key
        box = BoxSettings.objects.select_for_update().filter(pk=1).first()
        if box is not None and box.notify_urls_sealed:
            BoxSettings.objects.filter(pk=1).update(notify_urls_sealed=crypto.reencrypt(bytes(box.notify_urls_sealed)))
            reads.forget("box_settings")
            count += 1
    for task_id in list(Task.objects.values_list("pk", flat=True)):
        with transaction.atomic():
            stored = Task.objects.select_for_update().filter(pk=task_id).values("facts", "records").first()
            if stored is None:
                continue
            facts, facts_sealed = resealed(stored["facts"] or {})
            records, records_sealed = resealed(stored["records"] or {})
            if facts_sealed or records_sealed:
                Task.objects.filter(pk=task_id).update(facts=facts, records=records)
                count += facts_sealed + records_sealed
    return count


def rows_on_old_keys() -> list[str]:
    """What is not yet encrypted under the first key (must be empty before retiring old keys):
    vault names, and ``task <id>`` for tasks with sealed secret facts or saved values."""

    stale = [row.name for row in VaultSecret.objects.all() if not crypto.encrypted_with_first_key(bytes(row.ciphertext))]
    stale += [f"task {pk}" for pk, facts, records in Task.objects.values_list("pk", "facts", "records").iterator()
              if sealed_on_old_keys(facts or {}) or sealed_on_old_keys(records or {})]
    sealed_urls = BoxSettings.objects.filter(pk=1).values_list("notify_urls_sealed", flat=True).first()
    if sealed_urls and not crypto.encrypted_with_first_key(bytes(sealed_urls)):
        stale.append("settings notifyUrls")
    return stale

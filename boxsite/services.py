"""Every change to the owner's account: settings, API tokens, paired devices, pairing codes
and Web Push subscriptions.

Views call one of these; nothing else writes ``BoxSettings``, ``ApiToken``, ``Device``,
``PairingCode`` or ``PushSubscription`` (``approvals.push`` only forgets a subscription its push
service no longer knows). Raw secrets (token values, device keys, pairing codes) are returned once and
only their hashes are stored.
"""
from __future__ import annotations

import base64
import binascii
import os
import secrets
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from boxsite.core import setup_code
from boxsite.core.auth import issue_api_token
from boxsite.core.errors import Forbidden, InvalidRequest, NotFound
from boxsite.core.hostnames import is_loopback
from boxsite.core.principal import Principal
from boxsite.core.validation import MISSING, Body, Choice, Flag, Names, Obj, Problem, Text, Whole, time_zone_named
from boxsite.models import (
    ApiToken,
    BoxSettings,
    Device,
    NetworkDefault,
    PairingCode,
    PushSubscription,
    hash_key,
)
from tasks import notify
from tasks.spec.task import host_list, valid_host

PAIRING_TTL = timedelta(minutes=10)
# Crockford's base32 without the letters people misread (I, L, O, U): 8 characters = 40 bits,
# far more than can be guessed in the ten minutes a code lives, single use.
PAIRING_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
PAIRING_LENGTH = 8
DEVICE_KEY_PREFIX = "boxdev_"

Revocable = TypeVar("Revocable", ApiToken, Device)

class SettingsBody(Body):
    """``PATCH /api/settings``: any of the owner's defaults, each named by its model field."""

    what = "settings"
    defaultBudgetCents = Whole(required=False, between=True, max_value=10_000_000, source="default_budget_cents")
    networkDefault = Choice(list(NetworkDefault.values), required=False, source="network_default")
    defaultHosts = Names(required=False, invalid="'defaultHosts' must be a list of host names", source="default_hosts")
    retentionDays = Whole(required=False, between=True, min_value=1, max_value=36_500, source="retention_days")
    retentionCount = Whole(required=False, between=True, min_value=1, max_value=1_000_000, source="retention_count",
                           help_text="ended tasks whose history is kept (newest first)")
    maxActiveTasks = Whole(required=False, between=True, min_value=1, max_value=10_000, source="max_active_tasks")
    taskMemoryMb = Whole(required=False, between=True, min_value=16, max_value=16 * 1024 * 1024, source="task_memory_mb")
    taskCpuPercent = Whole(required=False, min_value=1, source="task_cpu_percent", help_text="100 is one core")
    taskDiskMb = Whole(required=False, between=True, min_value=16, max_value=1024 * 1024 * 1024, source="task_disk_mb",
                       help_text="what a new task may write to its layer (MB)")
    tasksMayCreateWork = Flag(required=False, source="tasks_may_create_work",
                              help_text="a running task may create child tasks and schedules (box task, box schedule)")
    maxCreatedPerTask = Whole(required=False, between=True, min_value=1, max_value=100, source="max_created_per_task",
                              help_text="the most tasks and schedules one task may create")
    timeZone = Text(required=False, max_length=64, source="time_zone",
                    help_text="the owner's calendar, an IANA name such as Europe/Berlin (the daily action count's days)")
    maxActionsPerDay = Whole(required=False, allow_null=True, between=True, min_value=1, max_value=1_000_000,
                             source="max_actions_per_day",
                             help_text="consequential actions a day; reaching it tells the owner once that day (null: no maximum)")
    notifyUrls = Names(required=False, source="notify_urls_sealed", invalid="'notifyUrls' must be a list of Apprise URLs",
                       help_text="Apprise URLs (ntfy://, tgram://, mailto://, slack://, matrix://, json://...) told of waits, "
                                 "failures and asked-for ends; the list replaces the stored one; an entry shown masked "
                                 "keeps the URL it stands for")

    def check_defaultHosts(self, value: Any, seen: dict[str, Any]) -> Any:
        for host in [] if value is MISSING else value:
            if not valid_host(host):
                raise Problem(f"'{host}' is not a host name, '*.domain' or an IP address")
        return value if value is MISSING else host_list(value)

    def check_notifyUrls(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return value
        kept = {notify.masked(url): url for url in notify.stored_urls()}
        urls = [kept.get(url.strip(), url.strip()) for url in value]
        problem = notify.urls_problem(urls)
        if problem:
            raise Problem(problem)
        return notify.seal_urls(urls)

    def check_timeZone(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is not MISSING:
            if time_zone_named(value) is None:
                raise Problem(f"'{value}' is not a time zone (an IANA name such as Europe/Berlin or UTC)")
        return value

    def check_taskCpuPercent(self, value: Any, seen: dict[str, Any]) -> Any:
        cores = os.cpu_count() or 1
        if value is not MISSING and value > 100 * cores:
            raise Problem(f"'taskCpuPercent' must be between 1 and {100 * cores}")
        return value


class TokenBody(Body):
    """``POST /api/tokens``."""

    what = "a token request"
    name = Text(max_length=100, invalid="give the token a name, so you know later what uses it")
    canUseFolders = Flag(required=False, help_text="may hand folders to tasks (only an asker who may)")


class PairingClaimBody(Body):
    """``POST /api/pairing/claim``: a phone spends the code the owner's settings show."""

    code = Text(invalid="type the code shown in the box's settings")
    name = Text(required=False, max_length=100_000, invalid="'name' must be text", help_text="default Phone")


class PushSubscriptionBody(Body):
    """``POST /api/push/subscriptions``: what the browser's ``PushSubscription`` holds."""

    what = "a push subscription"
    endpoint = Text(max_length=2000, invalid="'endpoint' is the push service's URL the browser gave",
                    help_text="the push service's URL for this browser (PushSubscription.endpoint)")
    keys = Obj(help_text="{p256dh, auth}: the browser's P-256 public key and auth secret, base64url")

    def check_endpoint(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return value
        parts = urlsplit(value)
        secure = parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.hostname or ""))
        if not secure or not parts.hostname:
            raise Problem("'endpoint' must be an https URL (a push service's)")
        return value

    def check_keys(self, value: Any, seen: dict[str, Any]) -> Any:
        if value is MISSING:
            return value
        if not isinstance(value, dict) or set(value) != {"p256dh", "auth"}:
            raise Problem("'keys' must be {\"p256dh\": ..., \"auth\": ...}, as the browser gives them")
        point, secret = _b64url(value["p256dh"]), _b64url(value["auth"])
        try:
            ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), point or b"")
        except ValueError:
            raise Problem("'keys.p256dh' is not a P-256 public key (base64url, uncompressed)") from None
        if secret is None or len(secret) != 16:
            raise Problem("'keys.auth' is not a 16-byte auth secret (base64url)")
        return value


def _b64url(value: Any) -> bytes | None:
    if not isinstance(value, str) or len(value) > 200:
        return None
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None


MIN_OWNER_PASSWORD = 10
MAX_USERNAME = 150


class OwnerExists(Exception):
    """The box already has its one owner."""

    def __init__(self, username: str) -> None:
        super().__init__(f"this box already has an owner ({username!r}); a box has one owner")
        self.username = username


def owner_password_problem(password: str) -> str | None:
    """Why ``password`` cannot be the owner's, or None: the one rule for the setup page and
    ``createowner``."""
    if len(password) < MIN_OWNER_PASSWORD:
        return f"Use at least {MIN_OWNER_PASSWORD} characters."
    return None


def current_owner() -> Any:
    return get_user_model().objects.filter(is_superuser=True).order_by("pk").first()


def create_owner(username: str, password: str) -> Any:
    """Create the box's one owner, or raise ``OwnerExists``. The caller checked the password
    (``owner_password_problem``)."""
    with transaction.atomic():
        # The settings row is the lock: two first visits at once create one owner.
        BoxSettings.objects.select_for_update().get_or_create(pk=1)
        existing = current_owner()
        if existing is not None:
            raise OwnerExists(existing.get_username())
        owner = get_user_model().objects.create_superuser(username=username, password=password, email="")
    setup_code.spend()  # the setup page is closed for good: no code opens it again
    return owner


def set_owner_password(username: str, password: str) -> Any:
    """Change the owner's password (``createowner --change-password``); every session and
    remembered sign-in of the owner ends with it."""
    owner = current_owner()
    if owner is None or owner.get_username() != username:
        raise NotFound(f"the box's owner is not named {username!r}")
    owner.set_password(password)
    owner.save(update_fields=["password"])
    return owner


def require_settings_right(principal: Principal) -> None:
    if not principal.can_change_settings:
        raise Forbidden("a paired device cannot see or change the box's settings", field=None)


# --- settings -----------------------------------------------------------------------------
def _whole(value: Any, key: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{key}' must be a whole number", field=key)
    if not minimum <= value <= maximum:
        raise InvalidRequest(f"'{key}' must be between {minimum} and {maximum}", field=key)
    return value


@transaction.atomic
def update_settings(principal: Principal, body: Any) -> BoxSettings:
    """Change some of the owner's defaults; the whole body is checked before anything is saved."""

    require_settings_right(principal)
    declared = SettingsBody()
    changes = declared.model_values(declared.check_all(body))
    # Lock the single row: two saves at once must not interleave their read-modify-write.
    row = BoxSettings.objects.select_for_update().get_or_create(pk=1)[0]
    for name, value in changes.items():
        setattr(row, name, value)
    if changes:
        row.save(update_fields=[*changes, "updated_at"])
    return row


# --- API tokens ---------------------------------------------------------------------------
def create_token(principal: Principal, body: Any) -> tuple[ApiToken, str]:
    require_settings_right(principal)
    checked = TokenBody.parse(body)
    name, folders = checked["name"], checked.get("canUseFolders", False)
    if folders and not principal.can_use_folders:
        # A token cannot mint a token with more power than it has.
        raise Forbidden("only the owner (or a token with that right) can give a token the folders right", field="canUseFolders")
    return issue_api_token(principal.user, name.strip(), can_use_folders=folders)


def revoke_token(principal: Principal, token_id: int) -> ApiToken:
    return _revoke(principal, ApiToken, token_id, "token")


def _revoke(principal: Principal, model: type[Revocable], row_id: int, noun: str) -> Revocable:
    """Revoke one of the owner's tokens or devices. Revoking twice keeps the first time."""
    require_settings_right(principal)
    row = model.objects.filter(pk=row_id, user=principal.user).first()
    if row is None:
        raise NotFound(f"no {noun} {row_id}")
    if row.revoked_at is None:
        row.revoked_at = timezone.now()
        row.save(update_fields=["revoked_at"])
    return row


# --- devices and pairing ------------------------------------------------------------------
def normalize_code(raw: str) -> str:
    """What a person typed, as stored: case and separators do not matter; O/I/L read as 0/1/1."""
    cleaned = "".join(ch for ch in raw.upper() if ch.isalnum())
    return cleaned.translate(str.maketrans("OIL", "011"))


def format_code(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


@transaction.atomic
def start_pairing(principal: Principal) -> tuple[PairingCode, str]:
    """A fresh one-time code for pairing one phone. Older unused codes stop working."""
    require_settings_right(principal)
    now = timezone.now()
    PairingCode.objects.filter(user=principal.user, used_at__isnull=True, expires_at__gt=now).update(expires_at=now)
    code = "".join(secrets.choice(PAIRING_ALPHABET) for _ in range(PAIRING_LENGTH))
    row = PairingCode.objects.create(user=principal.user, code_hash=hash_key(code), expires_at=now + PAIRING_TTL)
    return row, format_code(code)


@transaction.atomic
def pair_device(raw_code: str, name: str) -> tuple[Device, str]:
    """Spend a pairing code on a new device. Returns the device and its key (shown once, set as
    the phone's cookie). A used, expired or unknown code pairs nothing."""
    if not isinstance(raw_code, str) or not raw_code.strip():
        raise InvalidRequest("type the code shown in the box's settings", field="code")
    if not isinstance(name, str):
        raise InvalidRequest("'name' must be text", field="name")
    now = timezone.now()
    # The conditional update spends the code exactly once, even if two phones race for it.
    code_hash = hash_key(normalize_code(raw_code))
    spent = PairingCode.objects.filter(code_hash=code_hash, used_at__isnull=True, expires_at__gt=now).update(used_at=now)
    if spent != 1:
        raise InvalidRequest("that code is wrong, used or expired; show a new one in Settings", field="code")
    pairing = PairingCode.objects.select_related("user").get(code_hash=code_hash)
    key = DEVICE_KEY_PREFIX + secrets.token_urlsafe(32)
    device = Device.objects.create(user=pairing.user, name=(name.strip() or "Phone")[:100], key_hash=hash_key(key))
    return device, key


@transaction.atomic
def revoke_device(principal: Principal, device_id: int) -> Device:
    """Revoke a phone; its Web Push subscriptions go with it."""
    device = _revoke(principal, Device, device_id, "device")
    PushSubscription.objects.filter(device=device).delete()
    return device


# --- Web Push subscriptions ---------------------------------------------------------------
def subscribe_push(principal: Principal, body: Any) -> tuple[PushSubscription, bool]:
    """Keep a browser's push subscription (a paired phone's is its device's; one sent with the
    owner's session or token is the owner's), so the box's notices reach it by Web Push. The same endpoint again updates it. True when new."""
    fields = PushSubscriptionBody.parse(body)
    with transaction.atomic():
        row, created = PushSubscription.objects.update_or_create(
            endpoint=fields["endpoint"],
            defaults={"user": principal.user, "device": principal.device, "p256dh": fields["keys"]["p256dh"],
                      "auth": fields["keys"]["auth"]})
    return row, created


def push_subscriptions_for(principal: Principal) -> list[PushSubscription]:
    """A phone sees its own subscriptions; the owner sees every one of theirs."""
    rows = PushSubscription.objects.filter(user=principal.user)
    if principal.is_phone:
        rows = rows.filter(device=principal.device)
    return list(rows.select_related("device").order_by("-created_at", "-pk"))


def unsubscribe_push(principal: Principal, subscription_id: int) -> None:
    """Stop Web Push to one subscription (a phone may stop only its own)."""
    found = [row for row in push_subscriptions_for(principal) if row.pk == subscription_id]
    if not found:
        raise NotFound(f"no push subscription {subscription_id}")
    found[0].delete()

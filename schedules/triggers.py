"""Every change to a trigger: create, edit, pause, resume, delete, and webhook secret rotation.

A webhook's secret is returned once, by create and by rotate, and is stored encrypted with the
vault key (not hashed: verifying an HMAC needs the key itself). During a rotation the previous
secret stays valid until the rotation is finished or its grace period ends, so a sender can be
switched over without dropping deliveries.
"""
from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from boxsite.core.errors import Conflict, Forbidden, InvalidRequest
from boxsite.core.principal import Principal, Via
from boxsite.core.validation import Body, Choice, Flag, Number, Obj, Text, Whole, existing_dir
from schedules.models import Origin, Trigger, TriggerKind
from schedules.services import get_owned_for, name_field, origin_of
from schedules.specs import check_template
from tasks.vault.crypto import decrypt, encrypt

SECRET_MIN_LENGTH = 16
DEFAULT_GRACE_SECONDS = 24 * 3600
MAX_GRACE_SECONDS = 30 * 24 * 3600
MAX_SETTLE_SECONDS = 3600.0


def _secret_field() -> Text:
    return Text(required=False, min_length=SECRET_MIN_LENGTH, max_length=256,
                invalid=f"'secret' must be {SECRET_MIN_LENGTH} to 256 characters",
                length_message=f"'secret' must be {SECRET_MIN_LENGTH} to 256 characters",
                help_text="webhook: the signing secret to use (default: a fresh random one)")


def _settle_field() -> Number:
    return Number(required=False, min_value=0.0, max_value=MAX_SETTLE_SECONDS,
                  invalid=f"'settleSeconds' must be a number from 0 to {MAX_SETTLE_SECONDS:g}",
                  help_text="file trigger: how long a file must stay unchanged")


class TriggerBody(Body):
    """``POST /api/triggers``. The folder is checked against the asker in ``_folder``, the
    template as a task spec by ``check_template``."""

    name = name_field()
    kind = Choice(list(TriggerKind.values))
    template = Obj(help_text="a task spec without 'source'")
    secret = _secret_field()
    folder = Text(required=False, help_text="file trigger: the absolute folder to watch (owner only)")
    settleSeconds = _settle_field()
    paused = Flag(required=False)


class TriggerChangeBody(Body):
    """``PATCH /api/triggers/<id>``."""

    name = name_field(required=False)
    template = Obj(required=False, help_text="a task spec without 'source'")
    folder = Text(required=False, help_text="file trigger: the absolute folder to watch (owner only)")
    settleSeconds = _settle_field()


class RotateBody(Body):
    """``POST /api/triggers/<id>/rotate-secret``."""

    secret = _secret_field()
    graceSeconds = Whole(required=False, max_value=MAX_GRACE_SECONDS,
                         invalid=f"'graceSeconds' must be a whole number from 0 to {MAX_GRACE_SECONDS}",
                         help_text="how long the current secret stays valid (default a day)")


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def _secret(body: dict[str, Any]) -> str:
    """The owner's chosen secret (GitHub asks you to pick one) or a fresh random one."""
    return str(body.get("secret") or new_secret())


def _folder(principal: Principal, value: Any) -> str:
    if not principal.can_use_folders:
        raise Forbidden("only the owner can watch a folder", field="folder")
    return existing_dir(value, "folder")


def get_trigger_for(principal: Principal, trigger_id: Any, *, for_update: bool = False) -> Trigger:
    return get_owned_for(principal, Trigger, trigger_id, for_update=for_update)


def _may_change(principal: Principal, trigger: Trigger) -> None:
    if principal.via == Via.DEVICE and trigger.created_via != Origin.DEVICE:
        raise Forbidden("a paired device may change only the triggers it created", field="id")


def create_trigger(principal: Principal, body: Any, *, by_task: Any = None) -> tuple[Trigger, str | None]:
    """The trigger, and its secret (webhooks; the only time it is returned)."""
    body = TriggerBody.parse(body)
    name, kind = body["name"], body["kind"]
    paused = body.get("paused", False)
    fields: dict[str, Any] = {}
    secret: str | None = None
    if kind == TriggerKind.WEBHOOK:
        for key in ("folder", "settleSeconds"):
            if key in body:
                raise InvalidRequest(f"'{key}' is for file triggers", field=key)
        secret = _secret(body)
        fields.update(token=secrets.token_urlsafe(32), secret_ciphertext=encrypt(secret))
    else:
        if "secret" in body:
            raise InvalidRequest("'secret' is for webhook triggers", field="secret")
        if by_task is not None:
            raise Forbidden("only the owner can watch a folder", field="folder")
        fields["folder"] = _folder(principal, body.get("folder"))
        fields["machine"] = settings.BOX_MACHINE  # the folder was found on this machine's disk
        if "settleSeconds" in body:
            fields["settle_seconds"] = body["settleSeconds"]
    template = check_template(body.get("template"), principal.user, via=Via(kind), source=f"{kind}:{name}")
    try:
        with transaction.atomic():
            trigger = Trigger.objects.create(
                owner=principal.user, name=name, kind=kind, template=template, paused=paused,
                created_via=origin_of(principal, by_task), created_by_device=principal.device,
                created_by_task=by_task, **fields,
            )
    except IntegrityError as exc:
        raise Conflict(f"a trigger named '{name}' already exists", field="name") from exc
    return trigger, secret


def created_trigger(principal: Principal, trigger_id: str) -> tuple[Trigger, str | None] | None:
    """A trigger as its creation answers it again (an idempotent replay): with the secret it
    holds now, since the caller that repeats the request may never have seen the first answer."""
    trigger = Trigger.objects.filter(pk=trigger_id, owner=principal.user).first()
    if trigger is None:
        return None
    return trigger, decrypt(bytes(trigger.secret_ciphertext)) if trigger.secret_ciphertext else None


def update_trigger(principal: Principal, trigger_id: Any, body: Any) -> Trigger:
    body = TriggerChangeBody.parse(body)
    with transaction.atomic():
        trigger = get_trigger_for(principal, trigger_id, for_update=True)
        _may_change(principal, trigger)
        if trigger.kind == TriggerKind.WEBHOOK and ({"folder", "settleSeconds"} & set(body)):
            raise InvalidRequest("'folder' and 'settleSeconds' are for file triggers", field="folder")
        name = body.get("name", trigger.name)
        if "folder" in body:
            trigger.folder = _folder(principal, body["folder"])
            trigger.machine = settings.BOX_MACHINE
        if "settleSeconds" in body:
            trigger.settle_seconds = body["settleSeconds"]
        if "template" in body or "name" in body:
            trigger.template = check_template(body.get("template", trigger.template), trigger.owner,
                                              via=Via(trigger.kind), source=f"{trigger.kind}:{name}")
        trigger.name = name
        try:
            with transaction.atomic():
                trigger.save()
        except IntegrityError as exc:
            raise Conflict(f"a trigger named '{name}' already exists", field="name") from exc
    return trigger


def set_trigger_paused(principal: Principal, trigger_id: Any, paused: bool) -> Trigger:
    with transaction.atomic():
        trigger = get_trigger_for(principal, trigger_id, for_update=True)
        _may_change(principal, trigger)
        if trigger.paused != paused:
            Trigger.objects.filter(pk=trigger.pk).update(paused=paused, updated_at=timezone.now())
            trigger.paused = paused
    return trigger


def delete_trigger(principal: Principal, trigger_id: Any) -> None:
    with transaction.atomic():
        trigger = get_trigger_for(principal, trigger_id, for_update=True)
        _may_change(principal, trigger)
        trigger.delete()


def rotate_secret(principal: Principal, trigger_id: Any, body: Any) -> tuple[Trigger, str]:
    """A new secret (returned once). The current one stays valid for ``graceSeconds`` or until
    ``finish_rotation``; a rotation still in progress loses its oldest secret."""
    body = RotateBody.parse(body or {})
    grace = body.get("graceSeconds", DEFAULT_GRACE_SECONDS)
    with transaction.atomic():
        trigger = get_trigger_for(principal, trigger_id, for_update=True)
        _may_change(principal, trigger)
        if trigger.kind != TriggerKind.WEBHOOK:
            raise InvalidRequest("only a webhook trigger has a secret", field="id")
        secret = _secret(body)
        trigger.previous_secret_ciphertext = bytes(trigger.secret_ciphertext or b"") if grace else None
        trigger.previous_secret_expires_at = timezone.now() + timedelta(seconds=grace) if grace else None
        trigger.secret_ciphertext = encrypt(secret)
        trigger.save(update_fields=["previous_secret_ciphertext", "previous_secret_expires_at", "secret_ciphertext", "updated_at"])
    return trigger, secret


def finish_rotation(principal: Principal, trigger_id: Any) -> Trigger:
    """Stop accepting the previous secret now."""
    with transaction.atomic():
        trigger = get_trigger_for(principal, trigger_id, for_update=True)
        _may_change(principal, trigger)
        if trigger.kind != TriggerKind.WEBHOOK:
            raise InvalidRequest("only a webhook trigger has a secret", field="id")
        trigger.previous_secret_ciphertext = None
        trigger.previous_secret_expires_at = None
        trigger.save(update_fields=["previous_secret_ciphertext", "previous_secret_expires_at", "updated_at"])
    return trigger


def valid_secrets(trigger: Trigger) -> list[str]:
    """The secrets a delivery may be signed with now: the current one, and the previous one
    while its rotation is in progress."""
    found = [decrypt(bytes(trigger.secret_ciphertext))] if trigger.secret_ciphertext else []
    if trigger.rotating(timezone.now()):
        found.append(decrypt(bytes(trigger.previous_secret_ciphertext or b"")))
    return found

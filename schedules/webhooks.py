"""Receiving a webhook delivery: verify, deduplicate, and start one task.

How a payload reaches the task (its facts):

- ``payload``: the body as text, exactly as received (for a form-encoded GitHub delivery, the
  ``payload`` form field);
- ``payload.<path>``: when the body is JSON, every scalar in it under its dotted path, lists
  indexed by position: ``payload.action``, ``payload.pull_request.title``,
  ``payload.commits.0.id``. Strings as they are; numbers, true/false and null as JSON text
  (``"3"``, ``"true"``, ``""`` for null). At most ``MAX_PAYLOAD_FACTS`` of them, depth-first;
  when there are more, ``payload.truncated`` is ``"true"``;
- ``webhook.trigger``, ``webhook.delivery`` and ``webhook.event`` (``X-GitHub-Event`` or
  ``X-Box-Event``).

The template refers to them as ``${payload.action}`` (see ``schedules.specs`` for when they are
filled in). Names that look sensitive (``payload.token``) are secret facts like any other, so
they are redacted everywhere. Payload text comes from whoever holds the secret: treat it as
untrusted input in prompts.

A timestamped request is deduplicated by what is signed: its signature, the HMAC of timestamp and
body, so the same signed bytes within the tolerance window are a replay whatever the unsigned
``X-Box-Delivery`` header says (that header is only reported, as ``webhook.delivery``). A
GitHub-style request is deduplicated by ``X-GitHub-Delivery``; without one it has nothing to
deduplicate on (its signature has no timestamp, so GitHub's scheme cannot bound a replay).
"""
from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.datastructures import CaseInsensitiveMapping

from boxsite.core.errors import Conflict, Forbidden, InvalidRequest, NotFound
from boxsite.core.parsers import storable_text
from boxsite.core.principal import Principal, Via
from schedules.models import Delivery, Trigger, TriggerKind
from schedules.signatures import GITHUB_HEADER, SignatureError, Verified, github_header, verify
from schedules.specs import fill, firing_principal
from schedules.triggers import get_trigger_for, valid_secrets
from tasks import services as task_services
from tasks.models import Task

DELIVERY_HEADERS = ("X-GitHub-Delivery", "X-Box-Delivery")
EVENT_HEADERS = ("X-GitHub-Event", "X-Box-Event")
MAX_PAYLOAD_FACTS = 500
MAX_DEPTH = 16
MAX_DELIVERY_ID = 200


@dataclass(frozen=True)
class Received:
    task_id: str | None
    delivery_id: str
    duplicate: bool


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else json.dumps(value)


def payload_facts(body: bytes, content_type: str) -> dict[str, str]:
    """The facts a delivery gives its task (see the module docstring)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest("the body is not UTF-8 text", field="body") from exc
    if content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        form = parse_qs(text, keep_blank_values=True)
        if "payload" in form:
            text = form["payload"][0]
    if "\x00" in text:
        # PostgreSQL cannot store it in text, and no payload needs it.
        raise InvalidRequest("the payload contains a NUL character (\\u0000); the box cannot store it", field="body")
    facts = {"payload": text}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return facts
    flat: dict[str, str] = {}
    truncated = False

    def walk(value: Any, path: str, depth: int) -> None:
        nonlocal truncated
        if isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                truncated = True
                return
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                walk(item, f"{path}.{key}", depth + 1)
        elif len(flat) < MAX_PAYLOAD_FACTS:
            flat[path] = _scalar(value)
            if not storable_text(path) or not storable_text(flat[path]):  # "\\ud800" is valid JSON
                raise InvalidRequest("the payload contains a NUL character (\\u0000) or a lone surrogate (\\ud800); "
                                     "the box cannot store it", field="body")
        else:
            truncated = True

    if isinstance(data, (dict, list)):
        walk(data, "payload", 0)
    facts.update(flat)
    if truncated:
        facts["payload.truncated"] = "true"
    return facts


def _sender_delivery_id(headers: Mapping[str, str]) -> str:
    raw = next((headers[h] for h in DELIVERY_HEADERS if headers.get(h)), "")
    if len(raw) > MAX_DELIVERY_ID:
        raw = "sha256:" + hashlib.sha256(raw.encode()).hexdigest()
    return raw


def _dedupe_key(verified: Verified, sender_id: str) -> str:
    """What makes two requests the same delivery. For a timestamped request only signed bytes
    count: an unsigned header would let a captured request be replayed under a new id."""
    if verified.scheme == "timestamped":
        return f"sig:{verified.signature}"
    return sender_id


def receive(token: str, headers: Mapping[str, str], body: bytes, content_type: str = "") -> Received:
    """Act on one delivery. ``headers`` must be case-insensitive (``request.headers``)."""
    trigger = Trigger.objects.select_related("owner").filter(token=token, kind=TriggerKind.WEBHOOK).first()
    if trigger is None:
        raise NotFound("no webhook at this address")
    try:
        verified = verify(headers, body, valid_secrets(trigger), now=time.time())
    except SignatureError as exc:
        raise Forbidden(str(exc), field="signature") from exc
    if trigger.paused:
        raise Conflict("this webhook is paused", field="paused")
    sender_id = _sender_delivery_id(headers)
    delivery_id = _dedupe_key(verified, sender_id)
    facts = payload_facts(body, content_type)
    facts["webhook.trigger"] = trigger.name
    facts["webhook.delivery"] = sender_id or delivery_id
    facts["webhook.event"] = next((headers[h] for h in EVENT_HEADERS if headers.get(h)), "")
    if "\x00" in delivery_id + facts["webhook.event"]:
        raise InvalidRequest("a header contains a NUL character", field="headers")
    with transaction.atomic():
        delivery: Delivery | None = None
        if delivery_id:
            seen = Delivery.objects.filter(trigger=trigger, delivery_id=delivery_id).first()
            if seen is not None:
                return Received(seen.task_id, delivery_id, duplicate=True)
            try:
                # Two copies of one delivery at once: the unique constraint admits one; the
                # other waits for it to commit and then fails here.
                with transaction.atomic():
                    delivery = Delivery.objects.create(trigger=trigger, delivery_id=delivery_id)
            except IntegrityError:
                seen = Delivery.objects.filter(trigger=trigger, delivery_id=delivery_id).first()
                return Received(seen.task_id if seen else None, delivery_id, duplicate=True)
        task: Task = task_services.create_task(
            fill(trigger.template, facts), firing_principal(trigger.owner, Via.WEBHOOK), source=trigger.source
        )
        if delivery is not None:
            Delivery.objects.filter(pk=delivery.pk).update(task=task)
        Trigger.objects.filter(pk=trigger.pk).update(last_fired_at=timezone.now(), last_task=task)
    return Received(task.pk, delivery_id, duplicate=False)


TEST_PAYLOAD = {"action": "test", "test": True}


def send_test_delivery(principal: Principal, trigger_id: Any, body: Any) -> Received:
    """A test delivery, sent by the box to its own webhook the way a sender would: signed with the
    current secret and received by ``receive`` (signature check, pause, facts, a task). ``body``
    may carry ``payload`` (a JSON object; a small sample by default)."""
    if not isinstance(body, dict) or set(body) - {"payload"}:
        raise InvalidRequest("a test delivery takes {} or {\"payload\": {...}}", field="payload")
    payload = body.get("payload", TEST_PAYLOAD)
    if not isinstance(payload, dict):
        raise InvalidRequest("'payload' must be a JSON object", field="payload")
    trigger = get_trigger_for(principal, trigger_id)
    if trigger.kind != TriggerKind.WEBHOOK:
        raise InvalidRequest("only a webhook takes a test delivery", field="kind")
    secrets_now = valid_secrets(trigger)
    if not secrets_now:
        raise Conflict("this webhook has no secret to sign with", field="secret")
    raw = json.dumps(payload).encode()
    headers = CaseInsensitiveMapping({
        GITHUB_HEADER: github_header(secrets_now[0], raw),
        "X-Box-Delivery": f"test-{secrets.token_hex(8)}",
        "X-Box-Event": "test",
    })
    return receive(trigger.token or "", headers, raw, "application/json")

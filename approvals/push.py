"""Web Push to the owner's paired phones (and signed-in browsers): the same notices Apprise
sends (``tasks.notify``), through each browser's own push service, with Approve and Deny on an
approval's notice.

This app installs it as a ``tasks.notify`` channel (``ApprovalsConfig.ready``): the notices and
their moments are ``tasks.notify``'s; this module knows the subscriptions, the box's VAPID key
and the approve/deny links (``approvals.links``). A message is encrypted for its browser alone
(aes128gcm, RFC 8291) by ``pywebpush``; the push service sees only ciphertext. A phone is told
only what it may see: a task outside its inbox (a folder task) is named in no message to it.
A push service answering 404 or 410 has forgotten the subscription, so the box does too.
"""
from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from approvals import links
from approvals.models import Approval, ApprovalState
from boxsite.core.keyfiles import read_or_create
from boxsite.core.principal import Principal
from boxsite.models import PushSubscription
from tasks.models import Task
from tasks.notify import Delivery
from tasks.states import State

log = logging.getLogger(__name__)

KEY_FILE = "webpush-vapid.pem"
TIMEOUT_S = 10
TTL_S = 24 * 3600  # a phone that is off for a day gets what is still waiting when it is back
MAX_TITLE = 200
MAX_DETAIL = 1000  # a push message holds about 4 KB, links included
GONE = (404, 410)
HIDDEN_TITLES = {
    State.WAITING: "A task on the box waits for you",
    State.FAILED: "A task on the box failed",
    State.DONE: "A task on the box is done",
}


def _private_pem() -> bytes:
    """The box's VAPID key (P-256): ``BOX_WEBPUSH_VAPID_KEY`` (several machines share it), else
    generated into the data directory on first use (0600)."""
    if settings.BOX_WEBPUSH_VAPID_KEY:
        return f"{settings.BOX_WEBPUSH_VAPID_KEY}\n".encode()
    fresh = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return read_or_create(settings.BOX_DATA_DIR / KEY_FILE, fresh)


def public_key() -> str:
    """The VAPID public key as a browser's ``applicationServerKey`` takes it (base64url, the
    uncompressed point)."""
    key = serialization.load_pem_private_key(_private_pem(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    raw = key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def contact() -> str:
    """Who runs this sender, for push services (VAPID's ``sub``): the box's public https address,
    else a mailto that names no one."""
    public = settings.BOX_PUBLIC_URL or ""
    return public if public.startswith("https://") else "mailto:owner@the-box.invalid"


def payload_for(subscription: PushSubscription, task: Task, title: str, detail: str) -> dict[str, Any]:
    """What one browser is sent about ``task``: the notice, where tapping it leads, and for a
    phone deciding a lone pending approval, its signed Approve and Deny links."""
    device = subscription.device
    opens = "/ask" if device is not None else f"/tasks/{task.pk}"
    body: dict[str, Any] = {"title": title[:MAX_TITLE], "body": detail[:MAX_DETAIL], "url": opens,
                            "tag": f"task-{task.pk}", "task": task.pk, "actions": []}
    if device is None:
        return body
    if not Task.objects.inbox_of(Principal.phone(device)).filter(pk=task.pk).exists():
        return {**body, "title": HIDDEN_TITLES.get(State(task.state), "A task on the box has news for you"),
                "body": "", "task": None}
    pending = list(Approval.objects.filter(task=task, state=ApprovalState.PENDING).values_list("pk", flat=True)[:2])
    if task.state == State.WAITING and len(pending) == 1:
        for decision, label in (("approve", "Approve"), ("deny", "Deny")):
            token = links.sign(pending[0], decision, device.pk)
            body["actions"].append({"action": decision, "title": label, "url": links.api_url(token),
                                    "page": links.page_url(token)})
    return body


@dataclass
class WebPush:
    """The ``tasks.notify`` channel."""

    def wanted(self) -> bool:
        return PushSubscription.objects.exists()

    def tell(self, task: Task, title: str, detail: str) -> Delivery:
        delivery = Delivery()
        rows = PushSubscription.objects.filter(user_id=task.owner_id).filter(
            Q(device__isnull=True) | Q(device__revoked_at__isnull=True)).select_related("device")
        for subscription in rows:
            where = f"web push to {subscription.device.name}" if subscription.device else "web push to a browser"
            sent = send(subscription, payload_for(subscription, task, title, detail))
            (delivery.sent if sent else delivery.failed).append(where)
        return delivery


def send(subscription: PushSubscription, payload: dict[str, Any]) -> bool:
    """Encrypt ``payload`` for ``subscription``'s browser and hand it to its push service. A
    service that no longer knows the subscription (404, 410) has it deleted. Never raises."""
    # Imported here: pywebpush brings aiohttp and requests, which only a process sending a push needs.
    from py_vapid import Vapid  # noqa: PLC0415
    from pywebpush import WebPushException, webpush  # noqa: PLC0415

    info = {"endpoint": subscription.endpoint, "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth}}
    try:
        webpush(info, json.dumps(payload), vapid_private_key=Vapid.from_pem(_private_pem()),
                vapid_claims={"sub": contact()}, timeout=TIMEOUT_S, ttl=TTL_S, headers={"Urgency": "high"})
    except WebPushException as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in GONE:
            PushSubscription.objects.filter(pk=subscription.pk).delete()
            log.info("push subscription %s is gone (%s): removed", subscription.pk, status)
        else:
            log.warning("web push to subscription %s refused: %s", subscription.pk, status or exc)
        return False
    except Exception:  # noqa: BLE001 - one unreachable push service never stops the others or the caller
        log.warning("web push to subscription %s failed", subscription.pk, exc_info=True)
        return False
    PushSubscription.objects.filter(pk=subscription.pk).update(last_sent_at=timezone.now())
    return True


CHANNEL = WebPush()

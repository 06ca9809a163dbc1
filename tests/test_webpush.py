"""Web Push to a paired phone: the phone registers its browser's subscription, the box encrypts
each notice for that browser and hands it to the push service (here a local fake one: the test
plays the browser and decrypts what arrives), and an approval's notice carries signed Approve
and Deny links that work once, with no session."""
from __future__ import annotations

import base64
import json
import os
import secrets
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import http_ece
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from rest_framework.test import APIClient

from approvals import links, push
from boxsite.models import PushSubscription
from tasks.notify import SENDER
from tests.conftest import wait_for
from tests.factories import flow
from tests.http_server import Handler, serving
from tests.pauses.test_approvals import GUARDED

SECRET = "hunter2-canary-7731"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class PushService:
    """A push service on this machine: keeps what the box POSTs, answers ``status``."""

    url: str = ""
    status: int = 201
    received: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def messages(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.received)


@dataclass
class Browser:
    """The browser side of a subscription: its P-256 key pair and auth secret."""

    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    auth: bytes = field(default_factory=lambda: secrets.token_bytes(16))

    def keys(self) -> dict[str, str]:
        point = self.key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        return {"p256dh": b64(point), "auth": b64(self.auth)}

    def read(self, message: dict[str, Any]) -> dict[str, Any]:
        assert message["headers"]["content-encoding"] == "aes128gcm"
        plain = http_ece.decrypt(message["body"], private_key=self.key, auth_secret=self.auth, version="aes128gcm")
        return json.loads(plain)


@pytest.fixture
def push_service() -> Iterator[PushService]:
    service = PushService()

    class Receiver(Handler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's name for POST
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with service.lock:
                service.received.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
            self.reply(service.status)

    with serving(Receiver) as port:
        service.url = f"http://127.0.0.1:{port}"
        yield service
        SENDER.wait_sent()


def paired_phone(box: Any, name: str = "phone") -> tuple[APIClient, int]:
    code = box.api.post("/api/pairing").json()["code"]
    phone = APIClient()
    response = phone.post("/api/pairing/claim", {"code": code, "name": name}, format="json")
    assert response.status_code == 201
    return phone, response.json()["id"]


def subscribe(phone: APIClient, service: PushService, browser: Browser, path: str = "/push/1") -> dict[str, Any]:
    response = phone.post("/api/push/subscriptions", {"endpoint": service.url + path, "keys": browser.keys()},
                          format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def wait_pushes(service: PushService, count: int = 1) -> list[dict[str, Any]]:
    return wait_for(lambda: len(found := service.messages()) >= count and found, timeout=30,
                    what=f"{count} push message(s)")


def links_of_a_waiting_task(box: Any, service: PushService) -> tuple[dict[str, Any], dict[str, dict[str, Any]], int]:
    """A phone subscribed, a guarded task waiting for its OK: the task, its notice's actions by
    name (approve, deny) and the phone's device id."""
    phone, device_id = paired_phone(box)
    browser = Browser()
    subscribe(phone, service, browser)
    task = box.create(title="guarded", flow=GUARDED)
    box.wait_state(task["id"], "waiting")
    actions = {a["action"]: a for a in browser.read(wait_pushes(service)[0])["actions"]}
    return task, actions, device_id


def test_a_waiting_task_reaches_the_phone_encrypted_naming_it_with_its_links(box: Any, push_service: PushService) -> None:
    phone, _ = paired_phone(box)
    browser = Browser()
    subscribe(phone, push_service, browser)
    task = box.create(title=f"renew with {SECRET}", flow=GUARDED, facts={"password": SECRET})
    box.wait_state(task["id"], "waiting")
    [message] = wait_pushes(push_service)
    assert message["path"] == "/push/1"
    key = box.api.get("/api/push/key").json()["publicKey"]
    assert message["headers"]["authorization"].startswith("vapid t=")  # signed with the box's VAPID key
    assert message["headers"]["authorization"].endswith(f",k={key}") and message["headers"]["ttl"] == "86400"
    assert SECRET.encode() not in message["body"]  # the push service sees ciphertext only
    notice = browser.read(message)
    assert "renew with" in notice["title"] and "waits for your approval" in notice["title"]
    assert SECRET not in json.dumps(notice)
    assert notice["url"] == "/ask" and notice["task"] == task["id"]
    assert [a["action"] for a in notice["actions"]] == ["approve", "deny"]
    assert all(a["url"].startswith("/api/approval-links/") for a in notice["actions"])


def test_a_signed_approve_link_works_once_without_a_session(box: Any, push_service: PushService) -> None:
    task, actions, _ = links_of_a_waiting_task(box, push_service)
    approve = actions["approve"]

    stranger = APIClient()  # no cookie, no token: the link is the credential
    assert stranger.get(approve["url"]).status_code == 405  # a GET decides nothing
    used = stranger.post(approve["url"])
    assert used.status_code == 200 and used.json()["state"] == "approved"
    box.wait_state(task["id"], "done")  # the task resumed and finished
    again = stranger.post(approve["url"])
    assert again.status_code == 409 and again.json()["code"] == "LINK_USED"
    assert "once" in again.json()["message"]


def test_a_deny_link_denies_and_a_forged_or_changed_one_is_refused(box: Any, push_service: PushService) -> None:
    task, actions, _ = links_of_a_waiting_task(box, push_service)
    urls = {name: action["url"] for name, action in actions.items()}
    stranger = APIClient()
    rest = urls["approve"].rsplit("/", 1)[1].split(":", 1)[1]  # the signature, kept under other claims
    for forged in ("/api/approval-links/made-up", urls["approve"][:-2] + ("AA" if not urls["approve"].endswith("AA") else "BB"),
                   "/api/approval-links/" + b64(json.dumps({"a": 1, "d": "approve"}).encode()) + ":" + rest):
        refused = stranger.post(forged)
        assert refused.status_code == 404 and refused.json()["field"] == "token", forged
    assert box.task(task["id"])["state"] == "waiting"
    denied = stranger.post(urls["deny"])
    assert denied.status_code == 200 and denied.json()["state"] == "denied"
    box.wait_state(task["id"], "cancelled")
    late = stranger.post(urls["approve"])  # the other link of a decided approval
    assert late.status_code == 409 and "no longer pending" in late.json()["message"]


def test_the_link_page_asks_before_it_decides(box: Any, push_service: PushService) -> None:
    task, actions, _ = links_of_a_waiting_task(box, push_service)
    approve = actions["approve"]
    client = APIClient(enforce_csrf_checks=True)
    shown = client.get(approve["page"])
    assert shown.status_code == 200 and b"Approve</button>" in shown.content
    assert box.task(task["id"])["state"] == "waiting"  # looking decided nothing
    pressed = client.post(approve["page"])
    assert pressed.status_code == 200 and b"Approved" in pressed.content
    box.wait_state(task["id"], "done")
    assert client.post(approve["page"]).status_code == 409


def test_a_410_from_the_push_service_removes_the_subscription(box: Any, push_service: PushService) -> None:
    phone, _ = paired_phone(box)
    subscribe(phone, push_service, Browser())
    push_service.status = 410
    task = box.create(title="fails", flow=flow({"run": "exit 3"}))
    box.wait_state(task["id"], "failed")
    wait_pushes(push_service)
    wait_for(lambda: not PushSubscription.objects.exists(), what="the gone subscription removed")
    assert phone.get("/api/push/subscriptions").json()["results"] == []


def test_a_failure_and_an_asked_for_end_reach_the_phone(box: Any, push_service: PushService) -> None:
    phone, _ = paired_phone(box)
    browser = Browser()
    subscribe(phone, push_service, browser)
    failed = box.create(title="breaks", flow=flow({"run": "exit 3"}))
    box.wait_state(failed["id"], "failed")
    assert "“breaks” failed" in browser.read(wait_pushes(push_service)[0])["title"]
    done = box.create(title="told", flow=flow({"run": "true"}), notify={"done": True})
    box.wait_state(done["id"], "done")
    notice = browser.read(wait_pushes(push_service, 2)[1])
    assert "“told” is done" in notice["title"] and notice["actions"] == []


def test_revoking_the_phone_removes_its_subscriptions_and_stops_its_links(box: Any, push_service: PushService) -> None:
    task, actions, device_id = links_of_a_waiting_task(box, push_service)
    assert box.api.get("/api/push/subscriptions").json()["results"][0]["deviceName"] == "phone"
    approve = actions["approve"]
    assert box.api.post(f"/api/devices/{device_id}/revoke").status_code == 200
    assert box.api.get("/api/push/subscriptions").json()["results"] == []
    refused = APIClient().post(approve["url"])
    assert refused.status_code == 404 and "no longer paired" in refused.json()["message"]
    assert box.task(task["id"])["state"] == "waiting"


def test_an_expired_link_is_refused(box: Any, push_service: PushService, monkeypatch: pytest.MonkeyPatch) -> None:
    task, actions, _ = links_of_a_waiting_task(box, push_service)
    approve = actions["approve"]
    monkeypatch.setattr(links, "TTL", timedelta(seconds=-1))  # every link is older than that
    refused = APIClient().post(approve["url"])
    assert refused.status_code == 409 and refused.json()["code"] == "LINK_EXPIRED"
    assert box.task(task["id"])["state"] == "waiting"


@pytest.mark.parametrize(("body", "field_name"), [
    ({"endpoint": "ftp://push.example/1", "keys": Browser().keys()}, "endpoint"),
    ({"endpoint": "http://push.example/1", "keys": Browser().keys()}, "endpoint"),
    ({"endpoint": "https://push.example/1", "keys": {"p256dh": "AAAA", "auth": Browser().keys()["auth"]}}, "keys"),
    ({"endpoint": "https://push.example/1", "keys": {"p256dh": Browser().keys()["p256dh"], "auth": "short"}}, "keys"),
    ({"endpoint": "https://push.example/1", "keys": {**Browser().keys(), "extra": "x"}}, "keys"),
    ({"endpoint": "https://push.example/1"}, "keys"),
    ({"endpoint": "https://push.example/1", "keys": Browser().keys(), "expirationTime": None}, "expirationTime"),
])
def test_a_bad_subscription_is_refused_in_the_error_shape(box: Any, body: dict[str, Any], field_name: str) -> None:
    phone, _ = paired_phone(box)
    response = phone.post("/api/push/subscriptions", body, format="json")
    assert response.status_code == 400 and response.json()["code"] == "INVALID_REQUEST"
    assert response.json()["field"] == field_name
    assert not PushSubscription.objects.exists()


def test_the_vapid_key_is_made_once_into_the_data_dir_private(box: Any) -> None:
    first = box.api.get("/api/push/key").json()["publicKey"]
    path = settings.BOX_DATA_DIR / push.KEY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert box.api.get("/api/push/key").json()["publicKey"] == first
    assert len(base64.urlsafe_b64decode(first + "=")) == 65


def test_the_phone_page_links_the_manifest_and_the_service_worker_is_served_at_the_root(box: Any) -> None:
    manifest = APIClient().get("/manifest.webmanifest")
    assert manifest.status_code == 200 and manifest.json()["start_url"] == "/ask"
    assert {icon["sizes"] for icon in manifest.json()["icons"]} == {"192x192", "512x512"}
    worker = APIClient().get("/sw.js")
    assert worker.status_code == 200 and b"notificationclick" in worker.content
    phone, _ = paired_phone(box)
    page = phone.get("/ask")
    assert b'rel="manifest" href="/manifest.webmanifest"' in page.content and b"Notify this phone" in page.content


def test_a_vapid_key_given_by_environment_is_the_one_used(box: Any, settings: Any) -> None:
    # Several machines sign with one key (BOX_WEBPUSH_VAPID_KEY): a phone subscribed through one
    # machine takes pushes from every other.
    key = ec.generate_private_key(ec.SECP256R1())
    settings.BOX_WEBPUSH_VAPID_KEY = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()).decode().strip()
    point = key.public_key().public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    assert box.api.get("/api/push/key").json()["publicKey"] == base64.urlsafe_b64encode(point).rstrip(b"=").decode()


def test_several_machines_refuse_to_start_without_a_shared_vapid_key(tmp_path: Any) -> None:
    env = {**os.environ, "BOX_MACHINE": "a", "BOX_MACHINE_URL": "http://10.0.0.2:8000", "BOX_MACHINE_SECRET": "s" * 40,
           "DATABASE_URL": "postgres://box@127.0.0.1:5432/box", "REDIS_URL": "redis://127.0.0.1:6379/0",
           "DJANGO_SECRET_KEY": "k" * 50, "BOX_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "boxsite.settings"}
    env.pop("BOX_WEBPUSH_VAPID_KEY", None)
    started = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, cwd=settings.BASE_DIR,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "BOX_MACHINE needs BOX_WEBPUSH_VAPID_KEY" in started.stderr
    env["BOX_WEBPUSH_VAPID_KEY"] = "not a key"
    started = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, cwd=settings.BASE_DIR,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "BOX_WEBPUSH_VAPID_KEY is not a PEM private key" in started.stderr

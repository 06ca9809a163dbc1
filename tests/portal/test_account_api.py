"""The account API and the pages' doors: settings, tokens shown once, pairing a phone once, and
what a paired phone or a lesser token may not do."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from boxsite.core import setup_code
from boxsite.core.auth import DEVICE_COOKIE
from boxsite.models import ApiToken, Device, PairingCode
from tests.factories import make_owner
from tests.portal.conftest import pair_device

pytestmark = pytest.mark.django_db(transaction=True)


def phone_client(cookie: str) -> APIClient:
    client = APIClient()
    client.cookies[DEVICE_COOKIE] = cookie
    return client


def test_settings_change_defaults_that_new_tasks_then_use(box: Any) -> None:
    response = box.api.patch("/api/settings", {"defaultBudgetCents": 25, "networkDefault": "allowlist",
                                               "defaultHosts": ["PyPI.org", "*.github.com"], "retentionDays": 7}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["defaultHosts"] == ["pypi.org", "*.github.com"]
    task = box.create(title="uses the defaults", prompt="x")
    assert task["budgetCents"] == 25 and task["hosts"] == ["pypi.org", "*.github.com"]


@pytest.mark.parametrize("body, field", [
    ({"defaultBudget": 3}, "defaultBudget"),
    ({"defaultBudgetCents": -1}, "defaultBudgetCents"),
    ({"defaultBudgetCents": "5"}, "defaultBudgetCents"),
    ({"networkDefault": "open"}, "networkDefault"),
    ({"defaultHosts": ["not a host!"]}, "defaultHosts"),
    ({"retentionDays": 0}, "retentionDays"),
    ({"maxActiveTasks": True}, "maxActiveTasks"),
])
def test_bad_settings_name_the_field_and_change_nothing(box: Any, body: dict[str, Any], field: str) -> None:
    before = box.api.get("/api/settings").json()
    response = box.api.patch("/api/settings", {"retentionDays": 9, **body}, format="json")
    assert response.status_code == 400 and response.json()["field"] == field, response.json()
    assert box.api.get("/api/settings").json() == before


def test_a_token_is_shown_once_stored_as_a_hash_and_stops_working_when_revoked(box: Any) -> None:
    created = box.api.post("/api/tokens", {"name": "ci"}, format="json").json()
    raw = created["token"]
    assert not ApiToken.objects.filter(key_hash=raw).exists() and raw not in str(list(ApiToken.objects.values()))
    listed = box.api.get("/api/tokens").json()["results"]
    assert all("token" not in t for t in listed) and created["id"] in {t["id"] for t in listed}
    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert ci.get("/api/tasks").status_code == 200
    assert box.api.post(f"/api/tokens/{created['id']}/revoke").status_code == 200
    assert ci.get("/api/tasks").status_code == 401


def test_a_token_cannot_mint_a_token_with_more_power_than_it_has(box: Any) -> None:
    plain = box.api.post("/api/tokens", {"name": "plain"}, format="json").json()["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plain}")
    response = client.post("/api/tokens", {"name": "escalate", "canUseFolders": True}, format="json")
    assert response.status_code == 403 and response.json()["field"] == "canUseFolders"
    assert not ApiToken.objects.filter(name="escalate").exists()


def test_another_owner_cannot_revoke_my_token_or_device(box: Any) -> None:
    mine = box.api.post("/api/tokens", {"name": "mine"}, format="json").json()
    pair_device(box.api)
    device = Device.objects.get()
    stranger = APIClient()
    stranger.force_login(make_owner())
    assert stranger.post(f"/api/tokens/{mine['id']}/revoke").status_code == 404
    assert stranger.post(f"/api/devices/{device.pk}/revoke").status_code == 404
    assert ApiToken.objects.get(pk=mine["id"]).revoked_at is None and Device.objects.get().revoked_at is None


def test_a_pairing_code_pairs_one_phone_once_and_only_its_hash_is_kept(box: Any) -> None:
    start = box.api.post("/api/pairing").json()
    code = start["code"]
    assert code not in str(list(PairingCode.objects.values())) and "<svg" in start["qrSvg"]
    first = APIClient().post("/api/pairing/claim", {"code": code.lower().replace("-", " "), "name": "Pixel"}, format="json")
    assert first.status_code == 201 and first.json()["name"] == "Pixel"
    cookie = first.cookies[DEVICE_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and "key" not in first.json()
    again = APIClient().post("/api/pairing/claim", {"code": code, "name": "Thief"}, format="json")
    assert again.status_code == 400 and again.json()["field"] == "code"
    assert list(Device.objects.values_list("name", flat=True)) == ["Pixel"]


def test_an_expired_a_wrong_or_a_superseded_code_pairs_nothing(box: Any) -> None:
    old = box.api.post("/api/pairing").json()["code"]
    new = box.api.post("/api/pairing").json()["code"]  # showing a new code retires the old one
    assert APIClient().post("/api/pairing/claim", {"code": old}, format="json").status_code == 400
    assert APIClient().post("/api/pairing/claim", {"code": "ZZZZ-ZZZZ"}, format="json").status_code == 400
    PairingCode.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert APIClient().post("/api/pairing/claim", {"code": new}, format="json").status_code == 400
    assert not Device.objects.exists()


def test_a_paired_phone_may_ask_but_not_change_settings_or_hand_out_folders(box: Any, tmp_path: Any) -> None:
    phone = phone_client(pair_device(box.api))
    for method, path in (("get", "/api/settings"), ("patch", "/api/settings"), ("get", "/api/tokens"),
                         ("post", "/api/tokens"), ("get", "/api/devices"), ("post", "/api/pairing")):
        response = getattr(phone, method)(path, {}, format="json")
        assert response.status_code == 403, (method, path, response.json())
    folder = tmp_path / "mine"
    folder.mkdir()
    refused = phone.post("/api/tasks", {"title": "take it", "prompt": "x", "folder": str(folder)}, format="json")
    assert refused.status_code == 403 and refused.json()["field"] == "folders"
    asked = phone.post("/api/tasks", {"title": "ask", "prompt": "x"}, format="json")
    assert asked.status_code == 201 and asked.json()["source"] == "phone"


def test_a_revoked_phone_is_signed_out(box: Any) -> None:
    cookie = pair_device(box.api)
    phone = phone_client(cookie)
    assert phone.get("/api/tasks").status_code == 200
    device = Device.objects.get()
    assert box.api.post(f"/api/devices/{device.pk}/revoke").status_code == 200
    assert phone.get("/api/tasks").status_code == 401
    page = Client()
    page.cookies[DEVICE_COOKIE] = cookie
    assert "Pair this phone" in page.get("/ask").content.decode()


def test_the_setup_page_creates_one_owner_and_then_closes(transactional_db: Any) -> None:
    browser = Client(enforce_csrf_checks=False)
    code = setup_code.issue()  # the box's start prints it (tests/security/test_setup_code.py)
    assert browser.get("/").url == "/setup"
    short = browser.post("/setup", {"code": code, "username": "me", "password": "short", "password2": "short"})
    assert short.status_code == 400 and "at least 10" in short.content.decode()
    made = browser.post("/setup", {"code": code, "username": "me", "password": "long enough pass",
                                   "password2": "long enough pass"})
    assert made.status_code == 302 and made.url == "/tasks"
    late = Client().post("/setup", {"code": code, "username": "intruder", "password": "long enough pass",
                                    "password2": "long enough pass"})
    assert late.status_code == 302 and late.url == "/login"

    assert list(get_user_model().objects.values_list("username", flat=True)) == ["me"]


def test_the_setup_form_needs_the_csrf_token(transactional_db: Any) -> None:
    response = Client(enforce_csrf_checks=True).post("/setup", {"username": "x", "password": "long enough pass",
                                                                "password2": "long enough pass"})
    assert response.status_code == 403


@pytest.mark.parametrize("path", ["/tasks", "/inbox", "/settings", "/tasks/tk123"])
def test_portal_pages_need_the_owner_signed_in(box: Any, path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302 and response.url.startswith("/login")


def test_a_phone_cannot_open_the_owners_pages(box: Any) -> None:
    page = Client()
    page.cookies[DEVICE_COOKIE] = pair_device(box.api)
    assert page.get("/settings").status_code == 302
    assert page.get("/ask").status_code == 200

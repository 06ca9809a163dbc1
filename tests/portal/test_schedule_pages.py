"""The Schedules and Triggers pages' doors: the owner signed in gets them, anyone else (a paired
phone included) is sent to sign in; every control on them has a label. And the deliveries list
the Triggers page reads."""
from __future__ import annotations

import hashlib
import hmac
import json
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from boxsite.core.auth import DEVICE_COOKIE, issue_api_token
from tests.conftest import queue_through_the_cluster
from tests.factories import make_owner
from tests.portal.conftest import pair_device

PAGES = ["/schedules", "/triggers"]


def owner_browser(box: Any) -> Client:
    browser = Client()
    assert browser.login(username=box.owner.get_username(), password="a-long-password")
    return browser


class Controls(HTMLParser):
    """Collects form controls and the ids that labels point at (or controls inside a label)."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict[str, str | None]] = []
        self.labelled: set[str] = set()
        self.in_label = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "label":
            self.in_label += 1
            if a.get("for"):
                self.labelled.add(str(a["for"]))
        elif tag in ("input", "select", "textarea") and a.get("type") != "hidden":
            self.controls.append({**a, "_wrapped": "yes" if self.in_label else None})

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self.in_label -= 1

    def unlabelled(self) -> list[dict[str, str | None]]:
        return [c for c in self.controls
                if not c["_wrapped"] and c.get("id") not in self.labelled and not c.get("aria-label")]


@pytest.mark.parametrize("path", PAGES)
def test_the_pages_need_the_owner_signed_in(box: Any, path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login")


@pytest.mark.parametrize("path", PAGES)
def test_a_paired_phone_cannot_open_the_pages(box: Any, path: str) -> None:
    phone = Client()
    phone.cookies[DEVICE_COOKIE] = pair_device(box.api)
    response = phone.get(path)
    assert response.status_code == 302 and response["Location"].startswith("/login")
    assert phone.get("/ask").status_code == 200  # the same cookie is a working phone


@pytest.mark.parametrize("path", PAGES)
def test_a_bearer_token_is_no_way_into_the_pages(box: Any, path: str) -> None:
    # Tokens are for programs calling the API; the pages want the owner's session.
    response = Client().get(path, HTTP_AUTHORIZATION=f"Bearer {box.token}")
    assert response.status_code == 302 and response["Location"].startswith("/login")


@pytest.mark.parametrize("path,title", [("/schedules", "Schedules"), ("/triggers", "Triggers")])
def test_the_owner_gets_the_page_with_every_control_labelled(box: Any, path: str, title: str) -> None:
    response = owner_browser(box).get(path)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'<a href="{path}" aria-current="page">{title}</a>' in html
    assert 'name="csrf-token"' in html  # the page's script calls the API with it
    controls = Controls()
    controls.feed(html)
    assert len(controls.controls) > 10
    assert controls.unlabelled() == []


def test_the_schedules_page_offers_the_api_time_zones_and_the_box_workspaces(box: Any) -> None:
    html = owner_browser(box).get("/schedules").content.decode()
    assert '<option value="Europe/Berlin">' in html
    assert '<option value="home">home</option>' in html


def _signed(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_a_webhooks_recent_deliveries_list_the_tasks_they_started_and_only_to_its_owner(box: Any, settings: Any) -> None:
    queue_through_the_cluster(settings)  # the started tasks only need to exist
    made = box.api.post("/api/triggers", {"name": "issues", "kind": "webhook",
                                          "template": {"title": "triage ${payload.action}", "prompt": "look"}}, format="json")
    assert made.status_code == 201, made.json()
    hook = made.json()
    sender = APIClient()
    started = []
    for number in (1, 2):
        body = json.dumps({"action": f"opened-{number}"}).encode()
        answer = sender.post(hook["path"], body, content_type="application/json",
                             HTTP_X_HUB_SIGNATURE_256=_signed(hook["secret"], body), HTTP_X_GITHUB_DELIVERY=f"d-{number}")
        assert answer.status_code == 202, answer.content
        started.append(answer.json()["task"])

    deliveries = box.api.get(f"/api/triggers/{hook['id']}/deliveries").json()["results"]
    assert [(d["delivery"], d["task"]) for d in deliveries] == [("d-2", started[1]), ("d-1", started[0])]
    assert "secret" not in json.dumps(deliveries)

    stranger = APIClient()
    _, token = issue_api_token(make_owner(), "other")
    stranger.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert stranger.get(f"/api/triggers/{hook['id']}/deliveries").status_code == 404

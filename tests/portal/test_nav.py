"""The count beside "Inbox" is the same on every portal page, whichever app draws the page."""
from __future__ import annotations

import re
from typing import Any

from django.test import Client

from tests.factories import flow

PAGES = ["/tasks", "/inbox", "/settings", "/schedules", "/triggers"]
COUNT = re.compile(r'id="inbox-count" aria-label="(\d+) waiting for you"( hidden)?')


def shown_count(browser: Client, path: str) -> int | None:
    """The number the nav shows beside "Inbox", or None when it is hidden."""
    response = browser.get(path)
    assert response.status_code == 200, path
    match = COUNT.search(response.content.decode())
    assert match is not None, f"{path} has no inbox count in its nav"
    return None if match.group(2) else int(match.group(1))


def test_every_page_shows_how_many_approvals_and_questions_wait(box: Any) -> None:
    browser = Client()
    assert browser.login(username=box.owner.get_username(), password="a-long-password")
    assert {path: shown_count(browser, path) for path in PAGES} == dict.fromkeys(PAGES)

    guarded = box.create(title="guarded", flow=flow({"run": "true", "stop_before": "really run it"}))
    box.wait_state(guarded["id"], "waiting")
    missing = box.create(title="needs a value", flow=flow({"run": "echo ${recipient_email}"}))
    box.wait_state(missing["id"], "waiting")

    assert {path: shown_count(browser, path) for path in PAGES} == dict.fromkeys(PAGES, 2)


def test_the_sign_in_page_renders_without_a_count_for_someone_not_signed_in(box: Any) -> None:
    response = Client().get("/login")
    assert response.status_code == 200
    assert b"inbox-count" not in response.content

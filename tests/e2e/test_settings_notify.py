"""Settings → Notifications, in a real Chromium: URLs saved, shown with their tokens hidden, kept
when left as shown, and a URL Apprise cannot read answered next to the field."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tasks import notify
from tests.conftest import wait_for
from tests.e2e.conftest import create_owner

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN_URL = "ntfy://tk_page-token-5521@ntfy.example.org/box"


def test_the_owner_sets_notification_urls_and_sees_them_masked(page: Any) -> None:
    create_owner(page)
    page.goto("/settings")
    urls = page.get_by_label("Tell me at these addresses")
    urls.fill("nosuchservice://x")
    page.get_by_role("button", name="Save notifications").click()
    expect(page.locator('[data-error-for="notifyUrls"]')).to_contain_text("not an Apprise URL")
    assert notify.stored_urls() == []

    urls.fill(TOKEN_URL)
    page.get_by_role("button", name="Save notifications").click()
    wait_for(lambda: notify.stored_urls() == [TOKEN_URL], what="the URL saved")
    page.reload()
    shown = page.get_by_label("Tell me at these addresses").input_value()
    assert shown and "tk_page-token-5521" not in shown
    urls = page.get_by_label("Tell me at these addresses")
    urls.fill(shown + "\njson://127.0.0.1:9/hook")
    page.get_by_role("button", name="Save notifications").click()
    wait_for(lambda: notify.stored_urls() == [TOKEN_URL, "json://127.0.0.1:9/hook"], what="the list saved, the masked line kept")

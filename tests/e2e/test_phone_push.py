"""The phone page as an installable app: it links the web app manifest, registers the box's
service worker (whose scope is the whole site) and offers "Notify this phone"."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import create_owner
from tests.e2e.test_phone import paired_phone

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_phone_page_installs_and_registers_the_service_worker(page: Any, browser: Any, live_box: Any) -> None:
    create_owner(page)
    phone = paired_phone(page, browser, live_box)
    assert phone.locator('link[rel="manifest"]').get_attribute("href") == "/manifest.webmanifest"
    manifest = phone.evaluate("fetch('/manifest.webmanifest').then((r) => r.json())")
    assert manifest["start_url"] == "/ask" and manifest["display"] == "standalone"
    worker = phone.evaluate("navigator.serviceWorker.ready.then((r) => [r.scope, r.active.scriptURL])")
    assert worker == [f"{live_box.url}/", f"{live_box.url}/sw.js"]
    expect(phone.get_by_role("button", name="Notify this phone")).to_be_visible()
    phone.context.close()

"""The task window's Actions table follows the task live, like the log: a request that places an
order appears when it is proposed, turns unknown when its connection is cut, and succeeded once
the owner says it happened; the step then says it was not sent again, in plain words."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import PHONE, create_owner, screenshot
from tests.e2e.test_evidence import no_sideways_scroll, sign_in
from tests.e2e.test_portal import new_task, task_row
from tests.http_server import serving
from tests.test_actions import Shop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shop() -> Iterator[Any]:
    handler = type("ShopForTheWindow", (Shop,), {"calls": [], "resets": 1})  # the first order is cut off
    with serving(handler) as port:
        handler.url = f"http://127.0.0.1:{port}/orders"
        yield handler


def test_the_actions_table_follows_the_task_without_a_reload(page: Any, browser: Any, live_box: Any, shop: Any) -> None:
    create_owner(page)
    new_task(page, "Order a lamp", [
        {"name": "look", "run": "echo looked", "stop_before": "look before ordering"},
        {"name": "order", "http": {"url": shop.url, "method": "POST", "body": {"item": "lamp"}},
         "stop_before": "this places a real order"},
    ], **{"Hosts it may reach": "127.0.0.1"})
    row = task_row(page, "Order a lamp")
    expect(row.locator(".badge")).to_have_text("waiting for your OK", timeout=30_000)
    row.get_by_role("link", name="Order a lamp").click()
    page.evaluate("window.__notReloaded = true")
    table = page.get_by_role("region", name="Actions")
    expect(table).to_be_hidden()  # no action yet: the first step only runs a command

    blockers = page.get_by_role("region", name="Waiting for you")
    blockers.get_by_role("article").filter(has_text="look before ordering").get_by_role("button", name="Approve").click()
    order = table.get_by_role("row").filter(has_text="POST " + shop.url)
    expect(order.locator(".badge")).to_have_text("proposed", timeout=30_000)
    expect(order).to_contain_text("not yet")

    blockers.get_by_role("article").filter(has_text="this places a real order").get_by_role("button", name="Approve").click()
    expect(order.locator(".badge")).to_have_text("unknown", timeout=30_000)  # sent, and no answer came back
    question = blockers.get_by_role("article").filter(has_text=re.compile("happened", re.I))
    question.get_by_role("combobox").select_option("happened")
    question.get_by_role("button", name="Answer").click()
    expect(order.locator(".badge")).to_have_text("succeeded", timeout=30_000)
    expect(order).to_contain_text("the owner said: happened")
    expect(order).to_contain_text("confirmed by the owner")
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)
    assert len(shop.calls) == 1  # never sent a second time
    assert page.evaluate("window.__notReloaded") is True

    result = page.get_by_role("list", name="Action log").locator("li.kind-step_result").filter(has_text="step 2/2 http")
    expect(result).to_contain_text("not sent again: the owner said the earlier attempt")
    result.get_by_text("Result (not sent again)").click()
    expect(result.locator(".replayed")).to_contain_text("the owner said the earlier attempt")
    screenshot(page, "task-window-actions")

    phone = browser.new_context(base_url=live_box.url, **PHONE)
    try:
        small = phone.new_page()
        sign_in(small)
        small.goto(page.url)
        mine = small.get_by_role("region", name="Actions")
        expect(mine.locator(".badge")).to_have_text("succeeded")
        expect(mine.locator("time")).to_be_visible()  # a time of day, not the server's raw timestamp
        no_sideways_scroll(small)
        screenshot(small, "phone-task-actions")
    finally:
        phone.close()

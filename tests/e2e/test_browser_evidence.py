"""A browser task's evidence in the portal: before/after thumbnails under each acting step
(click to enlarge), in the report, and a wall's page image on the inbox card."""
from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tasks.browser.binary import missing_reason
from tests.browser.sites import serve
from tests.e2e.conftest import create_owner, screenshot
from tests.e2e.test_portal import new_task, task_row

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))]


def test_step_screenshots_show_as_thumbnails_that_enlarge_and_a_wall_shows_its_page_on_the_card(page: Any) -> None:
    create_owner(page)
    with serve() as site:
        new_task(page, "Look at the shop", [{"browse": f"{site.url}/shop"}, {"click": {"text": "Play 09:10"}}],
                 **{"Hosts it may reach": "127.0.0.1"})
        row = task_row(page, "Look at the shop")
        expect(row.locator(".badge")).to_have_text("done", timeout=60_000)
        row.get_by_role("link", name="Look at the shop").click()
        log = page.get_by_role("list", name="Action log")
        step = log.locator("li.kind-step_result").filter(has_text="step 2/2 click")
        before = step.get_by_role("button", name="Before: enlarge")
        expect(before).to_be_visible()
        expect(step.get_by_role("button", name="After: enlarge")).to_be_visible()
        # Loaded through the artifact URL (the image may still be on its way when the button shows).
        thumb = before.locator("img").element_handle()
        page.wait_for_function("img => img.complete && img.naturalWidth > 300", arg=thumb, timeout=30_000)
        before.click()
        large = page.get_by_role("dialog", name="Before")
        expect(large.locator("img")).to_be_visible()
        screenshot(page, "browser-step-enlarged")
        large.get_by_role("button", name="Close").click()
        expect(large).to_be_hidden()
        step.locator("details.result summary").click()
        expect(step.get_by_label("Element chosen")).to_contain_text("Play 09:10")

        page.get_by_role("tab", name="Report").click()
        expect(page.locator("#report").get_by_role("button", name="After: enlarge")).to_have_count(2)

        page.goto("/tasks")
        new_task(page, "Past the wall", [{"browse": f"{site.url}/captcha"}, {"click": {"text": "Go on"}, "timeout_s": 0.5}],
                 **{"Hosts it may reach": "127.0.0.1"})
        row = task_row(page, "Past the wall")
        expect(row.locator(".badge")).to_have_text(re.compile("waiting"), timeout=60_000)
        page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("Inbox")).click()
        card = page.get_by_role("article").filter(has_text="Past the wall")
        expect(card.get_by_role("button", name="The page now: enlarge")).to_be_visible()
        screenshot(page, "wall-card-with-page")

"""The task window shows the browser a wall kept, live, and the owner signs in through it: a
click on the picture lands in the page's field, keys typed there reach it."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tasks.browser.binary import missing_reason
from tests.browser.sites_walls import BUTTON_BOX, USER_BOX, middle, serve
from tests.conftest import wait_for
from tests.e2e.conftest import create_owner, screenshot
from tests.e2e.test_portal import new_task, task_row

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))]


def test_the_task_window_shows_the_kept_browser_live_and_the_owner_types_into_it(page: Any) -> None:
    create_owner(page)
    with serve() as site:
        new_task(page, "Members only", [{"browse": f"{site.url}/members"},
                                        {"click": {"text": "Continue to checkout"}, "timeout_s": 0.5}],
                 **{"Hosts it may reach": "127.0.0.1"})
        row = task_row(page, "Members only")
        expect(row.locator(".badge")).to_have_text("waiting for a person", timeout=60_000)
        row.get_by_role("link", name="Members only").click()
        # The wall's question is drawn above the view: clicks wait until the window settled.
        expect(page.get_by_role("button", name="Done, go on")).to_be_visible()
        view = page.get_by_role("region", name="The task's browser")
        picture = view.get_by_role("img", name="The task's browser, live")
        expect(picture).to_be_visible(timeout=30_000)
        page.wait_for_function("img => img.complete && img.naturalWidth > 300", arg=picture.element_handle(), timeout=30_000)
        screenshot(page, "task-window-live-browser")
        shown = picture.bounding_box()
        assert shown is not None

        def on_picture(box: tuple[int, int, int, int]) -> dict[str, float]:
            x, y = middle(box)
            scale = shown["width"] / 1280  # the picture is the page's viewport, 1280 CSS pixels wide, scaled
            return {"x": x * scale, "y": y * scale}

        picture.click(position=on_picture(USER_BOX))
        page.keyboard.type("bob")
        picture.click(position=on_picture(BUTTON_BOX))
        wait_for(lambda: site.posts["/members/login"] == 1, timeout=30, what="the form sent from the live view")
        assert site.bodies["/members/login"][0]["user"] == ["bob"]
        assert site.gets["/members"] == 1

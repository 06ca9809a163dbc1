"""Pairing a phone and asking from it, in a mobile viewport; what a paired phone may not do."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import PHONE, create_owner, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def pairing_code(page: Any) -> str:
    page.goto("/settings")
    page.get_by_role("button", name="Pair a phone").click()
    expect(page.get_by_role("img", name=re.compile("QR code to pair a phone"))).to_be_visible()
    code = page.get_by_label("Pairing code").inner_text().strip()
    assert re.fullmatch(r"[0-9A-Z]{4}-[0-9A-Z]{4}", code), code
    return code


def paired_phone(page: Any, browser: Any, live_box: Any) -> Any:
    """A phone-sized page paired with the box (by the owner signed in on ``page``), on Ask the box."""
    code = pairing_code(page)
    phone = browser.new_context(base_url=live_box.url, **PHONE).new_page()
    phone.context.set_default_timeout(20_000)
    phone.goto(f"/pair?code={code}")
    phone.get_by_label("Name for this phone").fill("Test phone")
    phone.get_by_role("button", name="Pair this phone").click()
    expect(phone.get_by_label("What should the box do?")).to_be_visible()
    return phone


def test_a_phone_pairs_once_asks_the_box_and_approves_with_one_tap(page: Any, browser: Any, live_box: Any) -> None:
    create_owner(page)
    code = pairing_code(page)
    screenshot(page, "settings")

    phone_context = browser.new_context(base_url=live_box.url, **PHONE)
    phone_context.set_default_timeout(20_000)
    phone = phone_context.new_page()
    phone.goto("/ask")
    expect(phone.get_by_role("heading", name="Pair this phone")).to_be_visible()
    phone.get_by_label("Pairing code").fill(code.replace("-", "").lower())  # typed loosely
    phone.get_by_label("Name for this phone").fill("Test phone")
    phone.get_by_role("button", name="Pair this phone").click()
    expect(phone.get_by_label("What should the box do?")).to_be_visible()
    assert "box_device" not in phone.evaluate("document.cookie")  # HttpOnly: no script can read it

    # The code pairs one phone once.
    other = browser.new_context(base_url=live_box.url, **PHONE).new_page()
    other.goto(f"/pair?code={code}")
    other.get_by_role("button", name="Pair this phone").click()
    expect(other.get_by_role("alert")).to_contain_text("wrong, used or expired")
    other.context.close()

    phone.get_by_label("What should the box do?").fill("Summarise the open issues")
    phone.get_by_role("button", name="Ask").click()
    recent = phone.get_by_role("list", name="Recent tasks")
    expect(recent.get_by_text("Summarise the open issues")).to_be_visible()
    expect(recent.get_by_text("phone", exact=True)).to_be_visible()
    expect(recent.locator(".badge")).to_have_text("waiting for a plan", timeout=30_000)

    # The owner starts a task that stops for an OK; the phone approves it with one tap.
    page.goto("/tasks")
    form = page.get_by_role("region", name="New task")
    form.get_by_label("Title").fill("Send the weekly note")
    form.get_by_label("What to do").fill("send it")
    form.get_by_label("Worker").select_option("flow")
    form.get_by_label("Steps (flow JSON)").fill(json.dumps({"steps": [{"run": "echo sent", "stop_before": "it sends mail"}]}))
    form.get_by_role("button", name="Start the task").click()
    card = phone.get_by_role("article").filter(has_text="it sends mail")
    expect(card).to_be_visible(timeout=30_000)
    screenshot(phone, "phone")
    card.get_by_role("button", name="Approve").tap()
    expect(phone.get_by_text("Nothing right now.")).to_be_visible()
    row = page.get_by_role("listitem").filter(has=page.get_by_role("link", name="Send the weekly note"))
    expect(row.locator(".badge")).to_have_text("done", timeout=30_000)

    # What a device may not do: settings, the owner's pages, folders.
    assert phone.request.get("/api/settings").status == 403
    assert phone.request.get("/api/devices").status == 403
    phone.goto("/settings")
    expect(phone.get_by_role("heading", name="Sign in")).to_be_visible()
    csrf = phone.context.cookies()
    token = next(c["value"] for c in csrf if c["name"] == "csrftoken")
    refused = phone.request.post("/api/tasks", data={"title": "take a folder", "prompt": "x", "folder": "/etc"},
                                 headers={"X-CSRFToken": token, "Referer": live_box.url + "/ask"})
    assert refused.status == 403 and refused.json()["field"] == "folders"

    # Revoking the phone in settings ends its access.
    page.goto("/settings")
    page.get_by_role("button", name="Revoke Test phone").click()
    page.get_by_role("dialog").get_by_role("button", name="Revoke Test phone").click()  # it asks first
    expect(page.get_by_role("list", name="Paired phones")).to_contain_text("revoked")
    assert phone.request.get("/api/tasks").status in (401, 403)
    phone_context.close()


def test_a_tap_before_the_page_script_has_run_is_held_and_sent_not_lost(page: Any, browser: Any, live_box: Any) -> None:
    """On a slow phone the Ask button is visible before the page's script has attached itself;
    a tap in that window is sent once the script runs, never turned into a reload of the page."""
    create_owner(page)
    phone = paired_phone(page, browser, live_box)

    held: list[Any] = []
    phone.route("**/js/ask.js", lambda route: held.append(route))  # the page's script does not arrive until released
    phone.goto("/ask", wait_until="commit")
    phone.get_by_label("What should the box do?").fill("Count the early taps")
    phone.get_by_role("button", name="Ask").click()
    phone.wait_for_function("() => true")  # the tap's events have been dispatched
    assert len(held) == 1 and "?" not in phone.url, phone.url  # no reload of the page
    held[0].continue_()

    recent = phone.get_by_role("list", name="Recent tasks")
    expect(recent.get_by_text("Count the early taps")).to_be_visible()
    expect(phone.get_by_label("What should the box do?")).to_have_value("")
    assert len(held) == 1
    phone.context.close()


def test_the_phones_recent_list_retries_a_task_that_ran_out_of_actions(page: Any, browser: Any, live_box: Any) -> None:
    create_owner(page)
    phone = paired_phone(page, browser, live_box)
    spec = {"title": "Two steps", "flow": {"steps": [{"run": "echo one"}, {"run": "echo two"}]}, "limits": {"max_actions": 1}}
    made = phone.evaluate("""async (spec) => {
        const token = document.querySelector('meta[name="csrf-token"]').content;
        const response = await fetch("/api/tasks", {method: "POST", credentials: "same-origin",
            headers: {"Content-Type": "application/json", "X-CSRFToken": token}, body: JSON.stringify(spec)});
        return response.status;
    }""", spec)
    assert made == 201
    row = phone.get_by_role("list", name="Recent tasks").get_by_role("listitem").filter(has_text="Two steps")
    expect(row.locator(".badge")).to_have_text("failed", timeout=30_000)
    retry = row.get_by_role("form", name="Retry “Two steps”")
    retry.get_by_label("Raise max_actions to").fill("2")
    retry.get_by_role("button", name="Retry").tap()
    expect(row.locator(".badge")).to_have_text("done", timeout=30_000)
    expect(row.get_by_role("form")).to_have_count(0)
    phone.context.close()

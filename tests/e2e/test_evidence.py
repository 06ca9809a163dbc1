"""The evidence in a real browser: each step's output collapsed under it in the task window
(expandable from the keyboard, monospace, its whole output a click away), the report's steps,
and an approval card that shows the exact command it approves; on a desktop and a phone-sized
screen."""
from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import PASSWORD, PHONE, create_owner, screenshot
from tests.e2e.test_phone import pairing_code
from tests.e2e.test_portal import new_task, task_row

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = [
    {"name": "build", "run": "for i in 1 2 3 4 5; do echo compiled part $i; done; echo 'warning: slow disk' >&2"},
    {"name": "record", "write": {"path": "out/result.txt", "content": "ok\n"}},
]


def sign_in(page: Any) -> None:
    page.goto("/")
    page.get_by_label("Name").fill("owner")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()


def no_sideways_scroll(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"the page is {width}px wide"


def test_each_step_shows_its_output_collapsed_under_it(page: Any, browser: Any, live_box: Any) -> None:
    create_owner(page)
    new_task(page, "Build it", STEPS)
    row = task_row(page, "Build it")
    expect(row.locator(".badge")).to_have_text("done", timeout=30_000)
    row.get_by_role("link", name="Build it").click()
    log = page.get_by_role("list", name="Action log")
    result = log.locator("li.kind-step_result").filter(has_text="step 1/2 run: exit 0")
    expect(result).to_be_visible()
    output = result.locator("details.result")
    expect(output).not_to_have_attribute("open", "")  # collapsed until asked for
    stdout = result.get_by_label("Output (stdout, last lines)")
    expect(stdout).to_be_hidden()
    # Opened from the keyboard: Tab to its summary, then Enter.
    result.get_by_text("Output", exact=True).focus()
    page.keyboard.press("Enter")
    expect(stdout).to_be_visible()
    expect(stdout).to_contain_text("compiled part 5")
    expect(result.get_by_label("Errors (stderr, last lines)")).to_have_text("warning: slow disk")
    font = stdout.evaluate("el => getComputedStyle(el).fontFamily")
    assert "mono" in font.lower() or "consolas" in font.lower(), font
    whole = result.get_by_role("link", name=re.compile(r"step-1-run-1-stdout\.txt"))
    expect(whole).to_be_visible()
    response = page.request.get(whole.get_attribute("href"))
    assert response.status == 200 and "compiled part 1\n" in response.text()
    write = log.locator("li.kind-step_result").filter(has_text="step 2/2 write")
    expect(write).to_contain_text("wrote out/result.txt (3 bytes)")
    screenshot(page, "task-window-step-output")

    page.get_by_role("tab", name="Report").click()
    report = page.locator("#report")
    expect(report.get_by_text("Step 1", exact=True)).to_be_visible()
    report.get_by_text("What it did").first.click()
    expect(report.get_by_label("Output (stdout, last lines)")).to_contain_text("compiled part 5")

    phone = browser.new_context(base_url=live_box.url, **PHONE)
    small = phone.new_page()
    try:
        sign_in(small)
        small.goto(page.url)
        result = small.get_by_role("list", name="Action log").locator("li.kind-step_result").first
        result.get_by_text("Output", exact=True).click()
        expect(result.get_by_label("Output (stdout, last lines)")).to_contain_text("compiled part 5")
        no_sideways_scroll(small)
        screenshot(small, "task-window-step-output-phone")
    finally:
        phone.close()


def test_an_approval_card_shows_the_command_it_approves(page: Any) -> None:
    create_owner(page)
    new_task(page, "Clean the build", [
        {"name": "draft", "write": {"path": "notes.txt", "content": "draft\n"}},
        {"name": "clean", "run": "rm -rf build && echo cleaned", "stop_before": "it deletes the build directory"},
    ])
    row = task_row(page, "Clean the build")
    expect(row.locator(".badge")).to_have_text("waiting for your OK", timeout=30_000)
    page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("Inbox")).click()
    card = page.get_by_role("article").filter(has_text="Clean the build")
    expect(card.get_by_label("Command it will run")).to_have_text("rm -rf build && echo cleaned")
    screenshot(page, "approval-card")

    task_row_link = card.get_by_role("link", name="Clean the build")
    task_row_link.click()
    blockers = page.get_by_role("region", name="Waiting for you")
    expect(blockers.get_by_label("Command it will run")).to_have_text("rm -rf build && echo cleaned")


def test_run_again_opens_the_form_filled_in_and_starts_an_edited_copy(page: Any) -> None:
    create_owner(page)
    new_task(page, "Make a note", [{"write": {"path": "note.txt", "content": "first\n"}}])
    row = task_row(page, "Make a note")
    expect(row.locator(".badge")).to_have_text("done", timeout=30_000)
    row.get_by_role("link", name="Make a note").click()
    page.get_by_role("group", name="Task actions").get_by_role("button", name="Run again").click()
    form = page.get_by_role("region", name="New task")
    expect(form.get_by_label("Title")).to_have_value("Make a note")
    expect(form.get_by_label("Title")).to_be_focused()
    expect(form.get_by_label("Worker")).to_have_value("flow")
    expect(form.get_by_label("Steps (flow JSON)")).to_have_value(re.compile(r'"path": "note.txt"'))
    expect(page.locator("#again-note")).to_contain_text("Running “Make a note” again")
    form.get_by_label("Title").fill("Make a note again")
    form.get_by_role("button", name="Run it again").click()
    again = task_row(page, "Make a note again")
    expect(again.locator(".badge")).to_have_text("done", timeout=30_000)
    expect(form.get_by_role("button", name="Start the task")).to_be_visible()
    assert "again=" not in page.url


def test_the_phone_says_why_an_ask_waits_offers_cancel_and_links_nowhere_it_cannot_go(page: Any, browser: Any, live_box: Any) -> None:
    create_owner(page)
    code = pairing_code(page)
    expect(page.get_by_role("alert").filter(has_text="a phone cannot reach it")).to_contain_text("BOX_PUBLIC_URL")
    context = browser.new_context(base_url=live_box.url, **PHONE)
    context.set_default_timeout(20_000)
    phone = context.new_page()
    try:
        phone.goto(f"/pair?code={code}")
        phone.get_by_label("Name for this phone").fill("Pocket")
        phone.get_by_role("button", name="Pair this phone").click()
        phone.get_by_label("What should the box do?").fill("Book a table for two")
        phone.get_by_role("button", name="Ask").click()
        row = phone.get_by_role("list", name="Recent tasks").get_by_role("listitem").filter(has_text="Book a table for two")
        expect(row.locator(".badge")).to_have_text("waiting for a plan", timeout=30_000)
        expect(row).to_contain_text("no model is configured")
        expect(row).to_contain_text("The owner can configure a model")

        page.goto("/tasks")
        new_task(page, "Send the note", [{"run": "echo sent", "stop_before": "it sends mail"}])
        card = phone.get_by_role("article").filter(has_text="it sends mail")
        expect(card.get_by_label("Command it will run")).to_have_text("echo sent", timeout=30_000)
        expect(card).to_contain_text("Task: Send the note")
        assert card.locator('a[href^="/tasks/"]').count() == 0  # the owner's window would ask the phone to sign in
        no_sideways_scroll(phone)
        screenshot(phone, "phone-approval-card")

        row.get_by_role("button", name="Cancel").tap()
        expect(row.get_by_role("button", name="Yes, cancel it")).to_be_focused()
        row.get_by_role("button", name="Yes, cancel it").tap()
        expect(row.locator(".badge")).to_have_text("cancelled", timeout=30_000)
        expect(row.get_by_role("button", name="Cancel")).to_have_count(0)
    finally:
        context.close()

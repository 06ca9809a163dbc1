"""Small defects a new owner found: focus kept through live updates, one inbox request per change
(not per event), tasks from the portal say so, nothing "being done" after the end, Revoke asks
first and a revoked token is no longer offered for copying, 44 px row buttons, honest cron words."""
from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import create_owner
from tests.e2e.test_portal import new_task, task_row

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_live_update_keeps_keyboard_focus_and_the_list_asks_for_the_inbox_count_rarely(page: Any) -> None:
    create_owner(page)
    inbox_requests: list[str] = []
    page.on("request", lambda r: inbox_requests.append(r.url) if "/api/inbox" in r.url else None)
    new_task(page, "Slow and steady", [{"name": f"part {i}", "run": "sleep 0.4"} for i in range(1, 6)])
    row = task_row(page, "Slow and steady")
    link = row.get_by_role("link", name="Slow and steady")
    link.focus()
    expect(link).to_be_focused()
    before = len(inbox_requests)
    expect(row.locator(".badge")).to_have_text("done", timeout=30_000)
    expect(task_row(page, "Slow and steady").get_by_role("link", name="Slow and steady")).to_be_focused()
    assert page.evaluate("document.activeElement !== document.body")
    assert len(inbox_requests) - before <= 2, inbox_requests  # 5 steps, a dozen events: not one per event

    link.click()
    expect(page.locator("#task-source")).to_have_text("portal")
    expect(page.locator("#task-state")).to_have_text("done")
    expect(page.locator("#task-step")).to_have_text("—")


def test_a_click_pressed_on_a_row_before_a_live_update_still_opens_the_task(page: Any) -> None:
    """A person presses a task's link as the task moves on: the row redrawn under the pointer
    between the press and the release lost the click (the page stayed on the list)."""
    create_owner(page)
    new_task(page, "Step by step", [{"name": f"part {i}", "run": "sleep 0.4"} for i in range(1, 6)])
    row = task_row(page, "Step by step")
    step = row.locator(".task-step")
    expect(step).to_contain_text("part", timeout=30_000)
    link = row.get_by_role("link", name="Step by step")
    box = link.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    expect(step).not_to_have_text(step.inner_text(), timeout=30_000)  # a live update came meanwhile
    page.mouse.up()
    expect(page.get_by_role("heading", name="Step by step")).to_be_visible()
    assert re.search(r"/tasks/[a-z0-9]+$", page.url), page.url


def test_a_refused_field_is_explained_in_the_forms_words(page: Any) -> None:
    create_owner(page)
    new_task(page, "   ", [{"run": "true"}])
    form = page.get_by_role("region", name="New task")
    error = form.locator('[data-error-for="title"]')
    expect(error).to_have_text("Title must not be empty")
    expect(form.get_by_label("Title")).to_have_attribute("aria-invalid", "true")


def test_revoke_asks_first_and_a_revoked_token_is_not_offered_for_copying(page: Any) -> None:
    create_owner(page)
    page.goto("/settings")
    page.get_by_label("Token name").fill("ci")
    page.get_by_role("button", name="Create token").click()
    expect(page.get_by_label("New token")).to_have_value(re.compile(r"^box_"))
    revoke = page.get_by_role("button", name="Revoke ci")
    assert revoke.bounding_box()["height"] >= 44
    revoke.click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Revoke ci?")
    dialog.get_by_role("button", name="Keep it as it is").click()
    expect(page.get_by_role("list", name="API tokens")).not_to_contain_text("revoked")
    revoke.click()
    page.get_by_role("dialog").get_by_role("button", name="Revoke ci").click()
    expect(page.get_by_role("list", name="API tokens")).to_contain_text("revoked")
    expect(page.get_by_text("Copy it now")).to_be_hidden()


def test_the_cron_hint_never_describes_a_time_the_validator_refuses(page: Any) -> None:
    create_owner(page)
    page.goto("/schedules")
    cron = page.get_by_label("Cron expression")
    cron.fill("5 * * * *")
    cron.dispatch_event("input")
    expect(page.locator("#cron-words")).to_contain_text("every hour at 05 past")
    cron.fill("61 * * * *")
    cron.dispatch_event("input")
    expect(page.locator("#cron-words")).not_to_contain_text("61 past")
    cron.fill("0 25 * * *")
    cron.dispatch_event("input")
    expect(page.locator("#cron-words")).not_to_contain_text("25:00")


def test_the_tasks_list_filters_by_state_and_searches_words(page: Any) -> None:
    create_owner(page)
    new_task(page, "Invoice March", [{"run": "true"}])
    expect(task_row(page, "Invoice March")).to_be_visible()
    new_task(page, "Backup photos", [{"run": "exit 1"}])
    expect(task_row(page, "Invoice March").locator(".badge")).to_have_text("done", timeout=30_000)
    expect(task_row(page, "Backup photos").locator(".badge")).to_have_text("failed", timeout=30_000)
    tasks = page.get_by_role("list", name="Tasks, newest first")
    search = page.get_by_role("search", name="Filter tasks")
    search.get_by_label("Search").fill("invoice")
    expect(tasks.get_by_role("listitem")).to_have_count(1)
    expect(tasks).to_contain_text("Invoice March")
    search.get_by_label("Search").fill("")
    search.get_by_label("State").select_option("failed")
    expect(tasks.get_by_role("listitem")).to_have_count(1)
    expect(tasks).to_contain_text("Backup photos")
    search.get_by_label("Search").fill("invoice")
    expect(page.get_by_text("No task matches.")).to_be_visible()

"""The portal in a real browser: owner setup and sign-in, tasks started from the form and watched
live, approvals from the inbox, the diff, undo, and settings."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import PASSWORD, create_owner, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def new_task(page: Any, title: str, steps: list[dict[str, Any]], **fields: str) -> None:
    """Fill the New task form for a flow task and submit it."""
    form = page.get_by_role("region", name="New task")
    form.get_by_label("Title").fill(title)
    form.get_by_label("What to do").fill(fields.pop("prompt", f"{title}, step by step"))
    form.get_by_label("Worker").select_option("flow")
    form.get_by_label("Steps (flow JSON)").fill(json.dumps({"steps": steps}))
    for label, value in fields.items():
        form.get_by_label(label).fill(value)
    form.get_by_role("button", name="Start the task").click()


def task_row(page: Any, title: str) -> Any:
    return page.get_by_role("listitem").filter(has=page.get_by_role("link", name=title))


def test_the_first_visit_creates_the_owner_and_later_visits_sign_in(page: Any) -> None:
    create_owner(page)
    page.get_by_role("button", name="Sign out").click()
    page.goto("/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto("/setup")  # the setup page is closed once there is an owner
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Name").fill("owner")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("do not match")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Tasks", exact=True)).to_be_visible()


def test_a_task_started_from_the_form_shows_its_steps_live(page: Any) -> None:
    create_owner(page)
    page.evaluate("window.__notReloaded = true")
    new_task(page, "Count to three", [
        {"name": "one", "run": "sleep 0.4"},
        {"name": "two", "run": "sleep 0.4"},
        {"name": "three", "write": {"path": "three.txt", "content": "3\n"}},
    ])
    row = task_row(page, "Count to three")
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("done", timeout=30_000)
    assert page.evaluate("window.__notReloaded") is True  # the list changed without a reload
    screenshot(page, "tasks")

    row.get_by_role("link", name="Count to three").click()
    expect(page.get_by_role("heading", name="Count to three")).to_be_visible()
    log = page.get_by_role("list", name="Action log")
    for step in ("one", "two", "three"):
        expect(log.get_by_text(re.compile(rf"step \d/3 \w+: {step}"))).to_be_visible()
    expect(page.locator("#task-progress-text")).to_have_text("100%")
    expect(page.locator("#stream-status")).to_have_text("Live")
    screenshot(page, "task-window")


def test_the_task_window_follows_a_running_task_without_reloading(page: Any) -> None:
    create_owner(page)
    new_task(page, "Slow steps", [{"name": f"part {i}", "run": "sleep 0.5"} for i in range(1, 5)])
    task_row(page, "Slow steps").get_by_role("link", name="Slow steps").click()
    page.evaluate("window.__notReloaded = true")
    log = page.get_by_role("list", name="Action log")
    expect(log.get_by_text("step 4/4 run: part 4")).to_be_visible(timeout=30_000)
    expect(page.locator("#task-state")).to_have_text("done")
    assert page.evaluate("window.__notReloaded") is True
    seqs = [int(s) for s in log.locator("li").evaluate_all("rows => rows.map(r => r.dataset.seq)")]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, in order


def test_bad_input_shows_the_api_message_next_to_the_field(page: Any) -> None:
    create_owner(page)
    form = page.get_by_role("region", name="New task")
    form.get_by_label("Title").fill("Reach a bad host")
    form.get_by_label("What to do").fill("anything")
    form.get_by_label("Hosts it may reach").fill("not a host!")
    form.get_by_role("button", name="Start the task").click()
    hosts_error = page.locator("#err-hosts")
    expect(hosts_error).to_contain_text("is not a host name")
    expect(form.get_by_label("Hosts it may reach")).to_have_attribute("aria-invalid", "true")
    form.get_by_label("Hosts it may reach").fill("")
    form.get_by_label("Title").fill("")
    form.get_by_role("button", name="Start the task").click()
    expect(page.locator("#err-title")).to_have_text("Title must not be empty")  # the form's words
    expect(page.get_by_role("list", name="Tasks, newest first").get_by_role("listitem")).to_have_count(0)


def test_approving_from_the_inbox_resumes_the_task(page: Any) -> None:
    create_owner(page)
    new_task(page, "Publish the notes", [
        {"name": "draft", "write": {"path": "notes.txt", "content": "draft\n"}},
        {"name": "publish", "run": "echo published > published.txt", "stop_before": "it publishes"},
    ])
    row = task_row(page, "Publish the notes")
    expect(row.locator(".badge")).to_have_text("waiting for your OK", timeout=30_000)
    inbox_link = page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("Inbox"))
    expect(inbox_link).to_contain_text("1")

    inbox_link.click()
    card = page.get_by_role("article").filter(has_text="Publish the notes")
    expect(card).to_be_visible()
    screenshot(page, "inbox")
    card.get_by_role("button", name="Approve").click()
    expect(page.get_by_text("Nothing is waiting for you.")).to_be_visible()

    page.get_by_role("link", name="Tasks", exact=True).click()
    expect(task_row(page, "Publish the notes").locator(".badge")).to_have_text("done", timeout=30_000)
    task_row(page, "Publish the notes").get_by_role("link", name="Publish the notes").click()
    expect(page.get_by_role("list", name="Action log").get_by_text("step 2/2 run: publish")).to_be_visible()


def test_an_input_question_is_answered_with_fields_typed_by_kind(page: Any) -> None:
    create_owner(page)
    new_task(page, "Write to someone", [{"write": {"path": "to.txt", "content": "${email} ${travellers count}"}}])
    task_row(page, "Write to someone").get_by_role("link", name="Write to someone").click()
    blockers = page.get_by_role("region", name="Waiting for you")
    email = blockers.get_by_label("email")
    expect(email).to_have_attribute("type", "email")
    expect(blockers.get_by_label("travellers count")).to_have_attribute("type", "number")
    email.fill("someone@example.com")
    blockers.get_by_label("travellers count").fill("2")
    blockers.get_by_role("button", name="Answer").click()
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)


def test_a_task_out_of_actions_is_retried_from_its_window_after_raising_the_limit(page: Any) -> None:
    create_owner(page)
    spec = {"title": "Three steps", "flow": {"steps": [
        {"name": "one", "run": "echo one >> trail.txt"},
        {"name": "two", "run": "echo two >> trail.txt"},
        {"name": "three", "run": "echo three >> trail.txt"},
    ]}, "limits": {"max_actions": 2}}
    # The portal's form has no limits field: the same API call its script makes.
    task_id = page.evaluate("""async (spec) => {
        const token = document.querySelector('meta[name="csrf-token"]').content;
        const response = await fetch("/api/tasks", {method: "POST", credentials: "same-origin",
            headers: {"Content-Type": "application/json", "X-CSRFToken": token}, body: JSON.stringify(spec)});
        return (await response.json()).id;
    }""", spec)
    page.goto(f"/tasks/{task_id}")
    expect(page.locator("#task-state")).to_have_text("failed", timeout=30_000)
    expect(page.locator("#task-error")).to_contain_text("raise limits.max_actions above 2 and retry the task")
    retry = page.get_by_role("form", name="Retry “Three steps”")
    raise_to = retry.get_by_label("Raise max_actions to")
    raise_to.fill("1")  # lower than the limit in force: refused, and said right here
    retry.get_by_role("button", name="Retry").click()
    expect(retry.get_by_role("alert")).to_contain_text("a retry only raises limits (at least 2)")
    expect(page.locator("#task-state")).to_have_text("failed")
    raise_to.fill("3")
    retry.get_by_role("button", name="Retry").click()
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)
    log = page.get_by_role("list", name="Action log")
    expect(log.get_by_text("step 3/3 run: three")).to_be_visible()
    expect(log.get_by_text(re.compile("retried by the owner .*raised limits.max_actions to 3"))).to_be_visible()
    expect(log.get_by_text("step 1/3 run: one")).to_have_count(1)  # the finished steps did not run again
    expect(page.get_by_role("form", name="Retry “Three steps”")).to_have_count(0)  # done: nothing to retry
    screenshot(page, "task-retried")

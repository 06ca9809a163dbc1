"""The owner's portal on a phone-sized screen (390×844, touch): the journeys the desktop tests
walk, tapped instead of clicked. An approval card says what it approves and one tap approves it;
a finished task runs again from its window; a schedule runs now and a webhook takes a test
delivery, each firing and delivery naming its task by title with its state; Settings keep a
retention count (a bad one answered next to its field) and pairing says a loopback box is out
of a phone's reach. Each row's buttons are big enough for a thumb (44 px), and no page needs
sideways scrolling."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import PHONE, create_owner
from tests.e2e.test_portal import new_task, task_row
from tests.e2e.test_schedules import create_nightly, fill_template, row

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def phone(browser: Any, live_box: Any) -> Iterator[Any]:
    context = browser.new_context(base_url=live_box.url, **PHONE)
    context.set_default_timeout(20_000)
    yield context.new_page()
    context.close()


def fits(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"{page.url} is {width}px wide on a 390px screen"


def thumb_sized(buttons: Any) -> None:
    assert buttons.count() > 0
    for index in range(buttons.count()):
        box = buttons.nth(index).bounding_box()
        assert box is not None and box["height"] >= 44, (buttons.nth(index).text_content(), box)


def test_on_a_phone_an_approval_card_says_what_it_approves_and_a_done_task_runs_again(phone: Any) -> None:
    create_owner(phone)
    new_task(phone, "Tidy the build", [
        {"name": "clean", "run": "rm -rf build && echo cleaned > cleaned.txt", "stop_before": "it deletes the build directory"},
    ])
    row_ = task_row(phone, "Tidy the build")
    expect(row_.locator(".badge")).to_have_text("waiting for your OK", timeout=30_000)
    fits(phone)

    phone.goto("/inbox")
    card = phone.get_by_role("article").filter(has_text="Tidy the build")
    expect(card.get_by_label("Command it will run")).to_have_text("rm -rf build && echo cleaned > cleaned.txt")
    fits(phone)
    thumb_sized(card.get_by_role("button"))
    card.get_by_role("button", name="Approve").tap()
    expect(phone.get_by_text("Nothing is waiting for you.")).to_be_visible()

    phone.goto("/tasks")
    expect(task_row(phone, "Tidy the build").locator(".badge")).to_have_text("done", timeout=30_000)
    task_row(phone, "Tidy the build").get_by_role("link", name="Tidy the build").tap()
    result = phone.get_by_role("list", name="Action log").locator("li.kind-step_result").first
    expect(result).to_contain_text("exit 0")
    fits(phone)

    phone.get_by_role("group", name="Task actions").get_by_role("button", name="Run again").tap()
    form = phone.get_by_role("region", name="New task")
    expect(form.get_by_label("Title")).to_have_value("Tidy the build")
    expect(form.get_by_label("Steps (flow JSON)")).to_have_value(re.compile(r"rm -rf build"))
    form.get_by_label("Title").fill("Tidy the build again")
    form.get_by_role("button", name="Run it again").tap()
    expect(task_row(phone, "Tidy the build again").locator(".badge")).to_have_text("waiting for your OK", timeout=30_000)
    fits(phone)


def test_on_a_phone_a_schedule_runs_now_and_a_webhook_takes_a_test_delivery(phone: Any) -> None:
    create_owner(phone)
    phone.goto("/schedules")
    schedule = create_nightly(phone, tap=True)
    expect(schedule).to_contain_text("every day at 03:00")
    fits(phone)
    thumb_sized(schedule.locator(".buttons").get_by_role("button"))
    next_run = schedule.locator("dd").first.text_content()
    schedule.get_by_role("button", name="Run now nightly").tap()
    expect(phone.get_by_role("status")).to_contain_text("Started “Nightly note” from nightly")
    assert schedule.locator("dd").first.text_content() == next_run  # the timetable is unchanged
    phone.goto("/tasks")
    expect(task_row(phone, "Nightly note").locator(".badge")).to_have_text("done", timeout=30_000)
    phone.goto("/schedules")
    schedule.get_by_text("Recent firings").tap()
    firing = phone.get_by_role("list", name="Recent firings of nightly").get_by_role("listitem")
    expect(firing).to_have_count(1)
    expect(firing.get_by_role("link", name="Nightly note")).to_be_visible()  # its task's title, not its id
    expect(firing.locator(".badge")).to_have_text("done")
    fits(phone)

    phone.goto("/triggers")
    form = phone.get_by_role("region", name="New trigger")
    form.get_by_label("Name").fill("deploys")
    fill_template(form, "Deploy ${payload.action}")
    form.get_by_role("button", name="Create trigger").tap()
    phone.get_by_role("region", name="Webhook deploys is ready").get_by_role("button", name="I have copied it").tap()
    hook = row(phone, "Webhooks", "deploys")
    fits(phone)
    thumb_sized(hook.locator(".buttons").get_by_role("button"))
    hook.get_by_role("button", name="Send a test deploys").tap()
    expect(phone.get_by_role("status")).to_contain_text("Test delivery sent to deploys")
    hook.get_by_text("Recent deliveries").tap()
    deliveries = phone.get_by_role("list", name="Recent deliveries to deploys")
    expect(deliveries.get_by_role("listitem")).to_have_count(1)
    expect(deliveries.get_by_role("link", name=re.compile(r"^Deploy "))).to_be_visible()  # its task's title, not its id
    expect(deliveries.locator(".badge")).to_have_count(1)  # and its state
    fits(phone)


def test_on_a_phone_settings_keep_a_retention_count_and_pairing_says_a_phone_cannot_reach_a_loopback_box(phone: Any) -> None:
    create_owner(phone)
    phone.goto("/settings")
    count = phone.get_by_label("Keep the history of at most this many finished tasks")
    count.fill("0")
    phone.get_by_role("button", name="Save defaults").tap()
    error = phone.locator('[data-error-for="retentionCount"]')
    expect(error).to_be_visible()
    expect(count).to_have_attribute("aria-invalid", "true")
    count.fill("25")
    phone.get_by_role("button", name="Save defaults").tap()
    expect(phone.get_by_role("status")).to_contain_text("Defaults saved")
    expect(error).to_be_hidden()
    phone.reload()
    expect(phone.get_by_label("Keep the history of at most this many finished tasks")).to_have_value("25")

    phone.get_by_role("button", name="Pair a phone").tap()
    expect(phone.get_by_label("Pairing code")).to_be_visible()
    expect(phone.get_by_role("alert").filter(has_text="a phone cannot reach it")).to_contain_text("BOX_PUBLIC_URL")
    fits(phone)

"""The phone and the portal do real work with a model: Settings → Model, Test connection, "Ask
the box" on the phone and a plain-language New task, against a real local chat-completions server."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import create_owner, screenshot
from tests.e2e.test_phone import paired_phone
from tests.fakemodel import FakeModel, call, fake_model, say  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_with_a_model_the_phone_and_the_portal_get_answers(page: Any, browser: Any, live_box: Any,
                                                           fake_model: FakeModel) -> None:  # noqa: F811
    create_owner(page)
    phone = paired_phone(page, browser, live_box)

    # No model yet: the phone says what the owner must configure, and links to it.
    phone.get_by_label("What should the box do?").fill("What is in the readme?")
    phone.get_by_role("button", name="Ask").click()
    row = phone.get_by_role("list", name="Recent tasks").get_by_role("listitem").filter(has_text="What is in the readme?")
    expect(row.locator(".badge")).to_have_text("waiting for a plan", timeout=90_000)
    expect(row.get_by_role("link", name="Settings → Model")).to_have_attribute("href", "/settings#model-heading")
    row.get_by_role("button", name="Cancel").tap()
    row.get_by_role("button", name="Yes, cancel it").tap()

    # The owner configures the model in Settings and tests the connection.
    page.goto("/settings")
    section = page.get_by_role("region", name="Model")
    section.get_by_label("Base URL").fill(fake_model.base_url)
    section.get_by_label("Model name").fill("fake-model")
    section.get_by_label("API key").fill("sk-e2e-key-123456")
    section.get_by_role("button", name="Save model").click()
    expect(section.locator("#model-state")).to_contain_text("Configured: fake-model")
    fake_model.answer(say("ready"), call("report_ready", word="ready"), say('{"ready": true}'))
    section.get_by_role("button", name="Test connection").click()
    # The web process's first model call imports the client library (seconds on a loaded machine).
    expect(section.get_by_role("status")).to_contain_text("It answered: “ready”", timeout=60_000)
    screenshot(page, "settings-model")

    # The phone asks; the box lists the files, reads the readme and answers.
    fake_model.answer(call("list_files", path="."), call("read_file", path="README.md"),
                      call("finish", answer="The readme says: It has a readme."))
    phone.get_by_label("What should the box do?").fill("Summarise the readme")
    phone.get_by_role("button", name="Ask").click()
    row = phone.get_by_role("list", name="Recent tasks").get_by_role("listitem").filter(has_text="Summarise the readme")
    expect(row.locator(".badge")).to_have_text("done", timeout=90_000)
    expect(row).to_contain_text("Answer: The readme says: It has a readme.")
    screenshot(phone, "phone-answer")

    # A plain-language New task in the portal runs to an answer shown in the task window.
    fake_model.answer(call("write_file", path="hello.txt", content="hi"), call("finish", answer="hello.txt written"))
    page.goto("/tasks")
    form = page.get_by_role("region", name="New task")
    form.get_by_label("Title").fill("Say hello")
    form.get_by_label("What to do").fill("write hello.txt")
    form.get_by_role("button", name="Start the task").click()
    page.get_by_role("link", name="Say hello").click()
    expect(page.locator("#task-state")).to_have_text("done", timeout=90_000)
    expect(page.locator("#task-answer")).to_contain_text("hello.txt written")
    assert "sk-e2e-key-123456" not in fake_model.everything_sent()

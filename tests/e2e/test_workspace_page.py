"""The workspace page in a real browser: its files listed, a file uploaded, the upload in its history."""
from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import create_owner

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_file_uploaded_on_the_workspace_page_lands_as_a_done_task(page: Any, live_box: Any) -> None:
    violations: list[str] = []
    page.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
    create_owner(page)
    page.goto("/workspaces/home")
    files = page.get_by_role("region", name="Files")
    expect(files.get_by_role("link", name="README.md")).to_be_visible()

    form = page.get_by_role("region", name="Upload a file")
    form.get_by_label("File").set_input_files({"name": "note.txt", "mimeType": "text/plain", "buffer": b"from the page\n"})
    form.get_by_label("Save as").fill("inbox/note.txt")
    form.get_by_role("button", name="Upload").click()
    expect(form.get_by_role("status")).to_have_text("Uploaded inbox/note.txt (14 bytes).")
    expect(files.get_by_role("button", name="inbox/")).to_be_visible()
    assert (live_box.home / "inbox").exists() is False  # the base is untouched: the file is in a layer

    history = page.get_by_role("region", name="History")
    history.get_by_role("link", name="Upload inbox/note.txt").click()
    expect(page.locator("#task-state")).to_have_text("done")
    page.get_by_role("link", name="home", exact=True).click()
    page.get_by_role("region", name="Files").get_by_role("button", name="inbox/").click()
    expect(page.get_by_role("region", name="Files").get_by_role("link", name="note.txt")).to_be_visible()
    assert violations == []

"""The diff, undo, and the Keep/Undo review of folder tasks (with a conflict), in a real browser."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import create_owner, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


def start_flow(page: Any, title: str, steps: list[dict[str, Any]], *, folder: Path | None = None) -> None:
    form = page.get_by_role("region", name="New task")
    form.get_by_label("Title").fill(title)
    form.get_by_label("What to do").fill(title)
    if folder is not None:
        form.get_by_label("My folders").check()
        form.get_by_label("Folders (absolute paths, one per line)").fill(str(folder))
    form.get_by_label("Worker").select_option("flow")
    form.get_by_label("Steps (flow JSON)").fill(json.dumps({"steps": steps}))
    form.get_by_role("button", name="Start the task").click()
    page.get_by_role("link", name=title).click()
    expect(page.get_by_role("heading", name=title)).to_be_visible()


def confirm(page: Any, button: str) -> None:
    page.get_by_role("group", name="Task actions").get_by_role("button", name=button, exact=True).click()
    page.get_by_role("dialog").get_by_role("button", name=f"{button} the task").click()


def test_the_diff_tab_shows_the_changes_and_undo_removes_them(page: Any, live_box: Any) -> None:
    create_owner(page)
    start_flow(page, "Greet the readme", [
        {"write": {"path": "hello.txt", "content": "hello\n"}},
        {"write": {"path": "README.md", "content": "# A project\n\nIt has a better readme.\n"}},
    ])
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)
    page.get_by_role("tab", name="Diff").click()
    panel = page.get_by_role("tabpanel", name="Diff")
    expect(panel.get_by_role("heading", name="Added (1)")).to_be_visible()
    expect(panel.get_by_role("heading", name="Modified (1)")).to_be_visible()
    expect(panel.get_by_role("heading", name="Deleted (0)")).to_be_visible()
    diff = panel.get_by_label("Unified diff")
    expect(diff.locator("span.add", has_text="+hello")).to_be_visible()
    expect(diff.locator("span.del", has_text="-It has a readme.")).to_be_visible()
    expect(diff.locator("span.add", has_text="+It has a better readme.")).to_be_visible()
    screenshot(page, "diff")

    page.get_by_role("tab", name="Log").focus()
    page.keyboard.press("ArrowRight")  # the tabs work from the keyboard
    expect(page.get_by_role("tab", name="Diff")).to_have_attribute("aria-selected", "true")
    confirm(page, "Undo")
    expect(page.locator("#task-state")).to_have_text("undone", timeout=30_000)
    expect(panel.get_by_text("No changes.")).to_be_visible()
    # an undone task can only be run again (a new task from its spec)
    expect(page.get_by_role("group", name="Task actions").get_by_role("button")).to_have_text(["Run again"])


def test_the_diff_tab_names_a_special_file_and_never_shows_its_content(page: Any, live_box: Any) -> None:
    create_owner(page)
    start_flow(page, "Make a pipe", [{"run": "mkfifo pipe"}, {"write": {"path": "note.txt", "content": "n\n"}}])
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)
    page.get_by_role("tab", name="Diff").click()
    panel = page.get_by_role("tabpanel", name="Diff")
    expect(panel.get_by_role("heading", name="Added (2)")).to_be_visible()
    expect(panel.get_by_text("Special files (listed, never opened or kept): pipe (fifo)")).to_be_visible()


def test_a_folder_task_waits_for_keep_refuses_a_conflict_and_can_be_undone(page: Any, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("buy milk\n")
    create_owner(page)

    start_flow(page, "Tidy the todo list", [{"write": {"path": "todo.txt", "content": "buy oat milk\n"}}], folder=folder)
    review = page.locator("#task-review")
    expect(review).to_contain_text("Nothing in your folders changes until you press Keep", timeout=30_000)
    assert (folder / "todo.txt").read_text() == "buy milk\n"
    (folder / "todo.txt").write_text("buy milk and bread\n")  # the owner edits the same file meanwhile
    page.get_by_role("group", name="Task actions").get_by_role("button", name="Keep").click()
    expect(review).to_contain_text("nothing was applied")
    expect(page.get_by_role("list", name="Conflicting paths")).to_have_text("todo.txt")
    assert (folder / "todo.txt").read_text() == "buy milk and bread\n"
    screenshot(page, "folder-conflict")
    page.reload()  # the conflict is still explained after a reload
    expect(page.get_by_role("list", name="Conflicting paths")).to_have_text("todo.txt")
    confirm(page, "Undo")
    expect(review).to_contain_text("Undone", timeout=30_000)
    assert (folder / "todo.txt").read_text() == "buy milk and bread\n"

    page.get_by_role("link", name="Tasks", exact=True).first.click()
    start_flow(page, "Add a done list", [{"write": {"path": "done.txt", "content": "milk\n"}}], folder=folder)
    expect(review).to_contain_text("Nothing in your folders changes until you press Keep", timeout=30_000)
    assert not (folder / "done.txt").exists()
    page.get_by_role("group", name="Task actions").get_by_role("button", name="Keep").click()
    expect(review).to_contain_text("Kept")
    assert (folder / "done.txt").read_text() == "milk\n"

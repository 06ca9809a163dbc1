"""The Schedules and Triggers pages in a real browser against the live box: a schedule made from
the form (a bad cron expression answered next to its field), paused, resumed, fired by the real
scheduler with a catch-up whose firing links to its task; a webhook whose secret is shown once,
a signed delivery that starts a task, and a secret rotation; and a paired phone kept out."""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone
from playwright.sync_api import expect

from schedules.models import Schedule
from tests.conftest import database_env
from tests.e2e.conftest import PHONE, create_owner, screenshot

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = json.dumps({"steps": [{"name": "note", "write": {"path": "note.txt", "content": "hello\n"}}]})


def fill_template(form: Any, title: str) -> None:
    form.get_by_label("Task title").fill(title)
    form.get_by_label("What to do").fill("write the note")
    form.get_by_label("Worker").select_option("flow")
    form.get_by_label("Steps (flow JSON)").fill(STEPS)


def row(page: Any, list_name: str, name: str) -> Any:
    return page.get_by_role("list", name=list_name).get_by_role("listitem").filter(
        has=page.get_by_role("heading", name=name, exact=True))


def create_nightly(page: Any, *, tap: bool = False) -> Any:
    """Create the schedule "nightly" (03:00 every day, a note-writing flow) from the form, with a
    tap on a phone; its row in the list."""
    form = page.get_by_role("region", name="New schedule")
    form.get_by_label("Name").fill("nightly")
    form.get_by_label("Cron expression").fill("0 3 * * *")
    fill_template(form, "Nightly note")
    button = form.get_by_role("button", name="Create schedule")
    if tap:
        button.tap()
    else:
        button.click()
    return row(page, "Schedules", "nightly")


def fits_a_phone(page: Any, name: str) -> None:
    """On a narrow screen the page reflows into one column: nothing needs sideways scrolling."""
    page.set_viewport_size({"width": 390, "height": 844})
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, name)
    page.set_viewport_size({"width": 1280, "height": 900})


def run_scheduler_once() -> None:
    """One tick of the real scheduler process against the test database."""
    env = database_env()
    env["BOX_QUEUE_NAME"] = str(settings.Q_CLUSTER["name"])
    done = subprocess.run([sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runscheduler", "--once"],
                          env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def deliver(url: str, secret: str, payload: dict[str, Any], delivery: str) -> tuple[int, dict[str, Any]]:
    """A webhook sender: the raw body signed GitHub-style with HMAC-SHA256."""
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "X-Hub-Signature-256": signature, "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": "issues"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_schedule_made_from_the_form_pauses_resumes_and_shows_its_catch_up_firing(page: Any) -> None:
    create_owner(page)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Schedules").click()
    expect(page.get_by_role("heading", name="Schedules", exact=True)).to_be_visible()
    expect(page.get_by_text("No schedules match.")).to_be_visible()

    form = page.get_by_role("region", name="New schedule")
    form.get_by_label("Name").fill("morning-report")
    form.get_by_label("Cron expression").fill("61 9 * * *")
    form.get_by_label("Time zone").fill("Europe/Berlin")
    fill_template(form, "Morning report")
    form.get_by_role("button", name="Create schedule").click()
    cron_error = page.locator("#schedule-err-cron")
    expect(cron_error).to_contain_text("'61 9 * * *' is not a 5-field cron expression")
    expect(form.get_by_label("Cron expression")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_role("list", name="Schedules").get_by_role("listitem")).to_have_count(0)

    form.get_by_label("Cron expression").fill("30 9 * * 1-5")
    expect(form.get_by_text("That is on weekdays at 09:30.")).to_be_visible()
    form.get_by_role("button", name="Create schedule").click()
    expect(cron_error).to_be_hidden()
    schedule = row(page, "Schedules", "morning-report")
    expect(schedule).to_contain_text("on weekdays at 09:30")
    expect(schedule).to_contain_text("30 9 * * 1-5 · Europe/Berlin")
    expect(schedule.locator(".badge")).to_have_text("active")
    expect(schedule).to_contain_text("Morning report")

    schedule.get_by_role("button", name="Pause morning-report").click()
    expect(schedule.locator(".badge")).to_have_text("paused")
    expect(schedule).to_contain_text("not while paused")
    page.get_by_label("Status").select_option("active")
    expect(schedule).to_have_count(0)  # the filter asks the API for active ones only
    page.get_by_label("Status").select_option("paused")
    expect(schedule).to_be_visible()
    schedule.get_by_role("button", name="Resume morning-report").click()
    expect(page.get_by_text("No schedules match.")).to_be_visible()  # no longer paused
    page.get_by_label("Status").select_option("")
    expect(schedule.locator(".badge")).to_have_text("active")

    # An hourly schedule, and the box "off" for a while: the real scheduler fires one catch-up.
    form.get_by_label("Every so often").check()
    form.get_by_label("Name").fill("hourly-sweep")
    form.get_by_label("Every", exact=True).fill("1")
    form.get_by_label("Unit").select_option("hours")
    fill_template(form, "Hourly sweep")
    form.get_by_role("button", name="Create schedule").click()
    hourly = row(page, "Schedules", "hourly-sweep")
    expect(hourly).to_contain_text("every hour")

    # Moving the clock is the one thing a browser test cannot do: the cursor goes back instead.
    Schedule.objects.filter(name="hourly-sweep").update(next_run_at=timezone.now() - timedelta(hours=2, minutes=5))
    run_scheduler_once()
    page.reload()
    hourly.get_by_text("Recent firings").click()
    firings = page.get_by_role("list", name="Recent firings of hourly-sweep")
    expect(firings.get_by_text("catch-up: 2 missed skipped")).to_be_visible()
    screenshot(page, "schedules")
    task_link = firings.get_by_role("link", name="Hourly sweep")  # the firing names its task by title
    task_link.click()
    expect(page.get_by_role("heading", name="Hourly sweep")).to_be_visible()
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)

    # Edit keeps the schedule; delete asks first.
    page.goto("/schedules")
    schedule.get_by_role("button", name="Edit morning-report").click()
    edit = page.get_by_role("region", name="Edit morning-report")
    expect(edit.get_by_label("Cron expression")).to_have_value("30 9 * * 1-5")
    edit.get_by_label("Task title").fill("Morning report, short")
    edit.get_by_role("button", name="Save changes").click()
    expect(schedule).to_contain_text("Morning report, short")
    schedule.get_by_role("button", name="Delete morning-report").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text("Delete morning-report?")
    dialog.get_by_role("button", name="Keep it as it is").click()
    expect(schedule).to_be_visible()
    schedule.get_by_role("button", name="Delete morning-report").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete morning-report").click()
    expect(schedule).to_have_count(0)
    expect(hourly).to_be_visible()
    fits_a_phone(page, "schedules-narrow")


def test_run_now_is_the_schedules_last_run_and_links_its_task(page: Any) -> None:
    create_owner(page)
    page.goto("/schedules")
    schedule = create_nightly(page)
    last_run = schedule.locator("dl.facts > div").filter(has=page.get_by_text("Last run", exact=True)).locator("dd")
    expect(last_run).to_have_text("never")
    schedule.get_by_role("button", name="Run now nightly").click()
    expect(page.get_by_role("status")).to_contain_text("Started “Nightly note” from nightly")
    expect(last_run).not_to_have_text("never")
    expect(last_run.locator("time")).to_have_attribute("datetime", re.compile(r"^\d{4}-\d\d-\d\dT"))
    page.reload()  # from the stored schedule, not only the page's memory of the click
    expect(last_run.locator("time")).to_be_visible()
    last_run.get_by_role("link", name="its task").click()
    expect(page.get_by_role("heading", name="Nightly note")).to_be_visible()
    expect(page.locator("#task-state")).to_have_text("done", timeout=30_000)


def test_a_webhook_shows_its_secret_once_and_a_signed_delivery_starts_a_task(page: Any, live_box: Any, tmp_path: Path) -> None:
    create_owner(page)
    page.goto("/triggers")
    form = page.get_by_role("region", name="New trigger")
    form.get_by_label("Name").fill("github-issues")
    fill_template(form, "Triage ${payload.action}")
    form.get_by_role("button", name="Create trigger").click()

    once = page.get_by_role("region", name="Webhook github-issues is ready")
    expect(once).to_contain_text("you will not see it again")
    secret = once.get_by_label("Signing secret").input_value()
    url = once.get_by_label("Webhook URL").input_value()
    assert len(secret) >= 32 and re.fullmatch(rf"{re.escape(live_box.url)}/hooks/[\w-]{{40,}}", url), url
    expect(once.get_by_role("button", name="Copy the secret")).to_be_visible()
    once.get_by_role("button", name="I have copied it").click()
    expect(once).to_be_hidden()
    page.reload()
    assert secret not in page.content()  # shown once: not in the list, not after a reload
    hook = row(page, "Webhooks", "github-issues")
    expect(hook).to_contain_text(url)

    status, answer = deliver(url, "not the secret at all", {"action": "forged"}, "forged-1")
    assert status == 403 and answer["field"] == "signature"
    status, answer = deliver(url, secret, {"action": "opened"}, "delivery-1")
    assert status == 202, answer

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Tasks").click()
    started = page.get_by_role("list", name="Tasks, newest first").get_by_role("link", name="Triage opened")
    expect(started).to_be_visible()
    expect(page.get_by_role("list", name="Tasks, newest first").get_by_role("link", name="Triage forged")).to_have_count(0)

    page.goto("/triggers")
    hook.get_by_text("Recent deliveries").click()
    deliveries = page.get_by_role("list", name="Recent deliveries to github-issues")
    expect(deliveries).to_contain_text("delivery-1")
    expect(deliveries.locator(".badge")).to_have_count(1)  # the task's state beside its title
    deliveries.get_by_role("link", name="Triage opened").click()
    expect(page.get_by_role("heading", name="Triage opened")).to_be_visible()

    # Rotation: the new secret is shown once; the old one works until the rotation is finished.
    page.goto("/triggers")
    hook.get_by_role("button", name="Rotate secret github-issues").click()
    page.get_by_role("dialog").get_by_role("button", name="Make a new secret").click()
    rotated = page.get_by_role("region", name="New secret for github-issues")
    expect(rotated).to_contain_text("you will not see it again")
    new_secret = rotated.get_by_label("Signing secret").input_value()
    assert new_secret and new_secret != secret
    expect(hook.locator(".badge", has_text="rotating")).to_be_visible()
    assert deliver(url, secret, {"action": "old-key"}, "delivery-2")[0] == 202
    assert deliver(url, new_secret, {"action": "new-key"}, "delivery-3")[0] == 202
    rotated.get_by_role("button", name="I have copied it").click()
    hook.get_by_role("button", name="Finish rotation github-issues").click()
    expect(hook.locator(".badge", has_text="rotating")).to_have_count(0)
    assert deliver(url, secret, {"action": "old-key-late"}, "delivery-4")[0] == 403

    # Paused, it starts nothing; resumed, it does again.
    hook.get_by_role("button", name="Pause github-issues").click()
    expect(hook.locator(".badge")).to_have_text("paused")
    assert deliver(url, new_secret, {"action": "while-paused"}, "delivery-5")[0] == 409
    hook.get_by_role("button", name="Resume github-issues").click()
    expect(hook.locator(".badge")).to_have_text("active")

    hook.get_by_text("Recent deliveries").click()
    deliveries = page.get_by_role("list", name="Recent deliveries to github-issues")
    expect(deliveries.get_by_role("listitem")).to_have_count(3)
    # A test delivery reads the list again: what the owner opened stays open, with the new one in it.
    hook.get_by_role("button", name="Send a test github-issues").click()
    expect(page.get_by_role("status")).to_contain_text("Test delivery sent to github-issues")
    expect(deliveries.get_by_role("listitem")).to_have_count(4)
    screenshot(page, "triggers")

    # A watched folder (owner only) next to it.
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    form.get_by_label("A file arrives in a folder").check()
    form.get_by_label("Name").fill("scans")
    form.get_by_label("Folder to watch").fill("relative/path")
    fill_template(form, "File ${file.name}")
    form.get_by_role("button", name="Create trigger").click()
    expect(page.locator("#trigger-err-folder")).to_contain_text("absolute path")
    form.get_by_label("Folder to watch").fill(str(inbox))
    form.get_by_role("button", name="Create trigger").click()
    folder = row(page, "Watched folders", "scans")
    expect(folder).to_contain_text(str(inbox))
    fits_a_phone(page, "triggers-narrow")

    hook.get_by_role("button", name="Delete github-issues").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete github-issues").click()
    expect(hook).to_have_count(0)
    status, _ = deliver(url, new_secret, {"action": "after-delete"}, "delivery-6")
    assert status == 404


def test_a_paired_phone_cannot_open_the_schedules_or_triggers_pages(page: Any, browser: Any, live_box: Any) -> None:
    create_owner(page)
    csrf = page.locator('meta[name="csrf-token"]').get_attribute("content")
    code = page.request.post("/api/pairing", headers={"X-CSRFToken": csrf}).json()["code"]
    phone_context = browser.new_context(base_url=live_box.url, **PHONE)
    phone = phone_context.new_page()
    phone.goto(f"/pair?code={code}")
    phone.get_by_label("Name for this phone").fill("Test phone")
    phone.get_by_role("button", name="Pair this phone").click()
    expect(phone.get_by_label("What should the box do?")).to_be_visible()
    for path in ("/schedules", "/triggers"):
        phone.goto(path)
        expect(phone.get_by_role("heading", name="Sign in")).to_be_visible()
        assert phone.url.startswith(f"{live_box.url}/login")
    expect(phone.get_by_role("link", name="Schedules")).to_have_count(0)
    phone_context.close()


def test_the_list_pages_by_the_apis_cursor_and_says_why_a_schedule_was_disabled(page: Any) -> None:
    create_owner(page)
    csrf = page.locator('meta[name="csrf-token"]').get_attribute("content")
    for n in range(23):
        made = page.request.post("/api/schedules", headers={"X-CSRFToken": csrf}, data={
            "name": f"job-{n:02d}", "intervalSeconds": 3600 + n * 60,
            "template": {"title": f"Job {n}", "prompt": "do it"}})
        assert made.status == 201, made.text()

    # Five failed firings in a row is the tick's business (tests/schedules); here only how the
    # page shows the outcome matters, so the outcome is written as the tick writes it.
    Schedule.objects.filter(name="job-05").update(
        enabled=False, next_run_at=None, consecutive_failures=5,
        disabled_reason="disabled after 5 failed firings: unknown workspace 'gone'")

    page.goto("/schedules")
    listed = page.get_by_role("list", name="Schedules").get_by_role("listitem")
    expect(listed).to_have_count(20)
    page.get_by_role("button", name="Show more schedules").click()
    expect(listed).to_have_count(23)
    expect(page.get_by_role("button", name="Show more schedules")).to_be_hidden()
    names = listed.get_by_role("heading").all_inner_texts()
    assert sorted(names) == [f"job-{n:02d}" for n in range(23)]  # each once, none lost at the seam

    page.get_by_label("Enabled").select_option("false")
    expect(listed).to_have_count(1)
    disabled = row(page, "Schedules", "job-05")
    expect(disabled.locator(".badge")).to_have_text("disabled")
    expect(disabled).to_contain_text("Disabled: disabled after 5 failed firings: unknown workspace 'gone'")
    disabled.get_by_role("button", name="Enable again job-05").click()
    expect(page.get_by_text("No schedules match.")).to_be_visible()
    page.get_by_label("Enabled").select_option("true")
    expect(disabled.locator(".badge")).to_have_text("active")
    expect(listed).to_have_count(20)

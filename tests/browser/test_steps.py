"""Browser steps in the task's own sandboxed Chromium, against local sites."""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from django.db.backends.signals import connection_created
from django.utils import timezone

from boxsite.models import BoxSettings
from tasks.models import Task
from tasks.retention import prune_expired
from tasks.run import lifecycle
from tests.factories import flow


def results(box: Any, task_id: str) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if e["kind"] == "step_result"]


def done_steps(box: Any, title: str, *steps: dict[str, Any]) -> list[dict[str, Any]]:
    """The step results of a task running ``steps`` on the local sites, once it is done."""
    task = box.create(title=title, hosts=["127.0.0.1"], flow=flow(*steps))
    view = box.wait_state(task["id"], "done", "failed", timeout=90)
    assert view["state"] == "done", view
    return results(box, task["id"])


def test_pick_the_cheapest_offer_and_extract_the_fares(sandboxed, site):
    task = sandboxed.create(title="shop", hosts=["127.0.0.1"], flow=flow(
        {"browse": f"{site.url}/shop"},
        {"extract": {"selector": "#fares"}, "save": "fares"},
        {"pick": {"selector": ".offer", "by": "cheapest", "price": ".price", "click": {"role": "button", "name": "Select"}},
         "save": "cheapest"},
        {"extract": "h1", "save": "heading"},
    ))
    view = sandboxed.wait_state(task["id"], "done", "failed", timeout=90)
    assert view["state"] == "done", (view, [e["summary"] for e in sandboxed.events(task["id"])])
    report = sandboxed.api.get(f"/api/tasks/{task['id']}/report").json()
    records = report["records"]
    assert records["fares"] == [{"Route": "DEL-BOM", "Fare": "4321"}, {"Route": "DEL-BLR", "Fare": "5120"}]
    assert records["cheapest"] == {"value": "Play 09:10 ₹4,321 Select"}
    assert records["heading"] == [{"value": "You chose Play 09:10"}]
    assert site.gets["/chosen"] == 1
    # Retention prunes the screenshots with the rest of the done task's history.
    images = [a["url"] for e in results(sandboxed, task["id"]) for a in e["artifacts"] if a["type"] == "image/png"]
    assert len(images) == 4 and all(sandboxed.api.get(url).status_code == 200 for url in images)
    settings_row = BoxSettings.current()
    settings_row.retention_days = 30
    settings_row.save()
    Task.objects.filter(pk=task["id"]).update(finished_at=timezone.now() - timedelta(days=40))
    assert prune_expired().history == [task["id"]]
    assert all(sandboxed.api.get(url).status_code == 404 for url in images)



def artifact(box: Any, event: dict[str, Any], suffix: str) -> bytes:
    found = [a for a in event["artifacts"] if a["name"].endswith(suffix)]
    assert found, (suffix, event["artifacts"])
    response = box.api.get(found[0]["url"])
    assert response.status_code == 200
    return b"".join(response.streaming_content) if response.streaming else response.content


PASSPORT = "Z98765432"


def test_a_form_is_filled_from_facts_and_the_secret_is_typed_but_never_shown(sandboxed, site):
    task = sandboxed.create(
        title="form", hosts=["127.0.0.1"], facts={"full_name": "Asha Rao", "passport_number": PASSPORT},
        secretFacts=["passport_number"],
        flow=flow(
            {"browse": f"{site.url}/form"},
            {"fill": {"label": "Full name", "value": "${full_name}"}},
            {"fill": {"selector": "#title", "value": "Ms"}},
            {"fill": {"label": "Passport number", "value": "${passport_number}"}},
            {"fill": {"label": "Passport number", "value": ""}},
            {"fill": {"placeholder": "nothing has this placeholder", "value": "x"}, "timeout_s": 0.5, "name": "a miss"},
        ))
    view = sandboxed.wait_state(task["id"], "failed", "done", timeout=90)
    assert view["state"] == "failed" and "a miss" not in view["error"] and "nothing on the page matches placeholder" in view["error"]
    steps = results(sandboxed, task["id"])
    name_step, title_step, secret_step, empty_step = steps[1], steps[2], steps[3], steps[4]
    # Every acting step: distinct before and after images, the snapshot it acted on, where and what.
    assert artifact(sandboxed, name_step, "before.png") != artifact(sandboxed, name_step, "after.png")
    assert name_step["data"]["element"]["id"] == "name" and name_step["data"]["title"] == "Form"
    assert name_step["data"]["url"] == f"{site.url}/form"
    assert "Full name" in artifact(sandboxed, name_step, "snapshot.txt").decode()
    assert title_step["data"]["element"]["tag"] == "select"
    # The field holding the secret is drawn empty: the image equals the one after emptying it.
    assert artifact(sandboxed, secret_step, "after.png") == artifact(sandboxed, empty_step, "after.png")
    snapshot = artifact(sandboxed, empty_step, "snapshot.txt").decode()  # taken with the secret in the field
    assert PASSPORT not in snapshot and "${passport_number}" in snapshot
    everything = str(sandboxed.events(task["id"])) + str(sandboxed.api.get(f"/api/tasks/{task['id']}/report").json())
    assert PASSPORT not in everything
    assert secret_step["data"]["element"]["secret"] is True


def test_a_step_after_a_quiet_page_reuses_its_image_and_one_after_a_changing_page_draws_again(sandboxed, site):
    steps = done_steps(sandboxed, "two pages",
                       {"browse": f"{site.url}/form"},
                       {"click": "h1"},
                       {"click": "h1"},
                       {"browse": f"{site.url}/ticking"},
                       {"click": "#a"},
                       {"click": "#b"})
    # Nothing changed on the form between steps 2 and 3: the image after one is the image before the next.
    assert artifact(sandboxed, steps[1], "after.png") == artifact(sandboxed, steps[2], "before.png")
    assert "Full name" in artifact(sandboxed, steps[2], "snapshot.txt").decode()
    # The ticking page changed in between: step 6's before-image and snapshot are of its own moment.
    assert artifact(sandboxed, steps[4], "after.png") != artifact(sandboxed, steps[5], "before.png")
    assert "Updated" in artifact(sandboxed, steps[5], "snapshot.txt").decode()


def test_a_step_after_a_page_whose_frame_changed_draws_again(sandboxed, site):
    """The page's own document stays the same; its frame's does not."""
    steps = done_steps(sandboxed, "a board", {"browse": f"{site.url}/ticking-framed"}, {"click": "#a"}, {"click": "#b"})
    assert artifact(sandboxed, steps[1], "after.png") != artifact(sandboxed, steps[2], "before.png")


def test_the_secret_was_really_typed(sandboxed, site):
    task = sandboxed.create(
        title="form", hosts=["127.0.0.1"], facts={"full_name": "Asha Rao", "passport_number": PASSPORT},
        secretFacts=["passport_number"],
        flow=flow(
            {"browse": f"{site.url}/form"},
            {"fill": {"label": "Full name", "value": "${full_name}"}},
            {"pick": {"selector": "#title", "option": "Dr"}},
            {"fill": {"label": "Passport number", "value": "${passport_number}"}},
            {"click": {"role": "button", "name": "Continue"}},
        ))
    view = sandboxed.wait_state(task["id"], "failed", "done", timeout=90)
    assert view["state"] == "done", view
    assert site.bodies["/form"] == [{"name": ["Asha Rao"], "title": ["Dr"], "passport": [PASSPORT]}]


def test_a_page_outside_origins_is_refused_and_logged(sandboxed, site):
    task = sandboxed.create(
        title="origins", hosts=["127.0.0.1", "localhost"], constraints={"origins": [site.url]},
        flow=flow({"browse": f"{site.url}/shop"}, {"browse": f"http://localhost:{site.port}/form"}))
    view = sandboxed.wait_state(task["id"], "failed", "done", timeout=90)
    assert view["state"] == "failed" and "not in constraints.origins" in view["error"]
    blocked = [e for e in sandboxed.events(task["id"]) if e["kind"] == "blocked_connection" and e["data"]["via"] == "browser"]
    assert [b["data"]["origin"] for b in blocked] == [f"http://localhost:{site.port}"], [b["summary"] for b in blocked]
    assert site.gets["/shop"] == 1 and site.gets["/form"] == 0


def test_every_thread_a_browser_run_starts_closes_its_database_connection(sandboxed, site):
    """A connection a thread leaves open holds a database session until a full garbage
    collection, in a worker that runs for weeks; a parked browser's thread holds it for the
    whole pause. Before: Chromium's start-up check (has the task ended?) left the browser
    thread's open, one per browser run (the suite's session-end check named it)."""
    opened: list[tuple[str, Any]] = []

    def record(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            opened.append((threading.current_thread().name, connection))

    connection_created.connect(record)
    try:
        task = sandboxed.create(title="shop", hosts=["127.0.0.1"], flow=flow({"browse": f"{site.url}/shop"}))
        view = sandboxed.wait_state(task["id"], "done", "failed", timeout=90)
        assert view["state"] == "done", view
        lifecycle.janitor.drain()
    finally:
        connection_created.disconnect(record)
    assert any(name.startswith("box-browser-") for name, _ in opened), opened

    def still_open() -> list[str]:
        return [name for name, wrapper in opened if wrapper.connection is not None]

    deadline = time.monotonic() + 10  # a heartbeat closes its own as its thread ends
    while still_open() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not still_open()

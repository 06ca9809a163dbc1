"""The actions real flows need, in the task's own sandboxed Chromium against local pages: press,
select, upload, downloads, dialogs, popups, a form in a frame, a button in a shadow root, and
waiting for text that appears later."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tasks.browser import pages
from tasks.sandbox.accounts import running_processes_of
from tests.browser.sites_actions import REPORT, Site, serve
from tests.browser.test_steps import artifact, results
from tests.browser.test_walls_payment import chromium_of
from tests.conftest import wait_for
from tests.factories import flow
from tests.fakemodel import (
    Answer,
    call,
    fake_model,  # noqa: F401 - fixture
    say,
)
from tests.model.conftest import model  # noqa: F401 - fixture
from tests.sandbox.conftest import uid_of


@pytest.fixture
def web(chromium: None) -> Iterator[Site]:
    with serve() as running:
        yield running


def run(box: Any, web: Site, *steps: dict[str, Any], state: str = "done", **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    task = box.create(title="actions", hosts=["127.0.0.1"], flow=flow(*steps), **spec)
    view = box.wait_state(task["id"], "done", "failed", "waiting", timeout=90)
    assert view["state"] == state, (view.get("error"), [e["summary"] for e in box.events(task["id"])], view)
    return view, box.api.get(f"/api/tasks/{task['id']}/report").json()


def test_press_enter_submits_a_search(sandboxed, web):
    _, report = run(sandboxed, web,
                    {"browse": f"{web.url}/search"},
                    {"fill": {"label": "Search flights", "value": "DEL BOM"}},
                    {"press": {"label": "Search flights", "keys": "Enter"}},
                    {"extract": "h1", "save": "heading"})
    assert report["records"]["heading"] == [{"value": "Results for DEL BOM"}]
    assert web.gets["/results"] == 1


def test_press_enter_in_a_card_form_stops_before_it_submits(sandboxed, web):
    view, _ = run(sandboxed, web,
                  {"browse": f"{web.url}/card"},
                  {"click": {"label": "Card number"}},
                  {"press": "Enter"},
                  state="waiting")
    assert (view["waitingFor"], view["continuable"]) == ("checkpoint", False), view
    assert web.posts == {}


def test_select_chooses_options_by_label_or_value(sandboxed, web):
    _, report = run(sandboxed, web,
                    {"browse": f"{web.url}/lists"},
                    {"select": {"label": "Size", "option": "Large"}, "save": "size"},
                    {"select": {"label": "Extras", "option": ["Bag", "meal"]}, "save": "extras"},
                    {"extract": "#out", "save": "out"})
    assert report["records"]["size"] == "Large" and report["records"]["extras"] == ["Bag", "Meal"]
    assert report["records"]["out"] == [{"value": "size=l extras=bag+meal"}]


def test_select_of_an_option_that_is_not_there_fails_naming_the_options(sandboxed, web):
    view, _ = run(sandboxed, web, {"browse": f"{web.url}/lists"}, {"select": {"label": "Size", "option": "Huge"}},
                  state="failed")
    assert "no option 'Huge'" in view["error"] and "'Medium'" in view["error"]


def test_upload_sends_a_file_of_the_tasks_copy(sandboxed, web):
    (sandboxed.home / "docs").mkdir()
    (sandboxed.home / "docs" / "cv.txt").write_text("Asha Rao, pilot")
    view, report = run(sandboxed, web,
                       {"browse": f"{web.url}/upload"},
                       {"upload": {"label": "Your CV", "file": "docs/cv.txt"}},
                       {"wait": {"text": "cv.txt:"}},
                       {"extract": "#got", "save": "got"})
    assert report["records"]["got"] == [{"value": "cv.txt: Asha Rao, pilot"}]
    upload = results(sandboxed, view["id"])[1]
    assert upload["data"]["element"]["files"] == [{"file": "docs/cv.txt", "bytes": 15}]


def test_upload_refuses_a_link_out_of_the_copy(sandboxed, web, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the site")
    (sandboxed.home / "cv.txt").symlink_to(secret)
    view, _ = run(sandboxed, web, {"browse": f"{web.url}/upload"}, {"upload": {"label": "Your CV", "file": "cv.txt"}},
                  state="failed")
    assert "outside the task's files" in view["error"], view


def test_a_download_is_saved_into_the_copy_with_a_safe_name(sandboxed, web):
    view, report = run(sandboxed, web,
                       {"browse": f"{web.url}/download"},
                       {"click": {"text": "Export the report"}},
                       {"run": "ls downloads && cat downloads/*.csv", "save": "listing"},
                       {"run": "ls -A", "save": "top"})
    assert report["records"]["top"] == "downloads"  # the staging folder is gone
    listing = report["records"]["listing"]
    assert listing == "bashrc report.csv\n" + REPORT.strip(), listing
    click = results(sandboxed, view["id"])[1]
    [saved] = click["data"]["downloads"]
    assert saved["file"] == "downloads/bashrc report.csv" and saved["bytes"] == len(REPORT)
    assert sandboxed.api.get(saved["artifact"]["url"]).status_code == 200


def test_a_download_larger_than_the_limit_fails_the_step(sandboxed, web, monkeypatch):
    monkeypatch.setattr(pages, "MAX_DOWNLOAD_BYTES", 1024 * 1024)
    view, _ = run(sandboxed, web, {"browse": f"{web.url}/download"}, {"click": {"text": "Export everything"}},
                  {"run": "ls -A", "save": "listing"}, state="failed")
    assert "larger than the task's limit" in view["error"], view


def test_dialogs_are_answered_as_the_step_says(sandboxed, web):
    _, report = run(sandboxed, web,
                    {"browse": f"{web.url}/dialogs"},
                    {"click": "#del", "dialog": "accept"},
                    {"extract": "#out", "save": "accepted"},
                    {"click": "#del", "dialog": "dismiss"},
                    {"extract": "#out", "save": "dismissed"},
                    {"click": "#ask", "dialog": {"accept": "summary.csv"}},
                    {"extract": "#out", "save": "prompted"})
    records = report["records"]
    assert records["accepted"] == [{"value": "deleted"}] and records["dismissed"] == [{"value": "kept"}]
    assert records["prompted"] == [{"value": "renamed to summary.csv"}]


def test_an_unexpected_dialog_is_dismissed_and_logged(sandboxed, web):
    view, report = run(sandboxed, web, {"browse": f"{web.url}/dialogs"}, {"click": "#del"}, {"extract": "#out", "save": "out"})
    assert report["records"]["out"] == [{"value": "kept"}]
    click = results(sandboxed, view["id"])[1]
    assert click["data"]["dialogs"] == [{"type": "confirm", "message": "Delete report.csv?", "answer": "dismissed",
                                         "unexpected": True}]
    notes = [e["summary"] for e in sandboxed.events(view["id"]) if e["kind"] == "note"]
    assert "an unexpected confirm was dismissed: Delete report.csv?" in notes


def test_a_popup_becomes_the_page_and_a_step_goes_back_to_the_first_tab(sandboxed, web):
    view, report = run(sandboxed, web,
                       {"browse": f"{web.url}/popup"},
                       {"click": {"text": "Read the terms"}},
                       {"extract": "h1", "save": "in_popup"},
                       {"tab": "first", "save": "back"},
                       {"extract": "h1", "save": "first"})
    records = report["records"]
    assert records["in_popup"] == [{"value": "Terms of carriage"}] and records["first"] == [{"value": "Booking"}]
    assert records["back"] == {"url": f"{web.url}/popup", "tab": 1, "of": 2}
    assert results(sandboxed, view["id"])[1]["data"]["tab"]["opened"] == f"{web.url}/terms"


def test_a_form_inside_a_frame_is_filled_and_sent(sandboxed, web):
    run(sandboxed, web,
        {"browse": f"{web.url}/framed"},
        {"fill": {"label": "Email", "frame": "#signup", "value": "asha@example.com"}},
        {"click": {"role": "button", "name": "Sign up", "frame": {"url": "/inner"}}},
        {"wait": {"text": "Received /inner", "frame": "#signup"}})
    assert web.posts["/inner"] == [{"email": ["asha@example.com"]}]


def test_text_and_role_targets_reach_into_an_open_shadow_root(sandboxed, web):
    _, report = run(sandboxed, web,
                    {"browse": f"{web.url}/shadow"},
                    {"click": {"role": "button", "name": "Show details"}},
                    {"extract": "#out", "save": "by_role"},
                    {"click": {"text": "Show details"}},
                    {"extract": {"text": "Concert"}, "save": "shadow_text"})
    assert report["records"]["by_role"] == [{"value": "Doors open at 7 pm"}]
    assert report["records"]["shadow_text"] == [{"value": "Concert, 8 pm"}]


MEMBER_CODE = "K7Q2-99X4"


def test_a_secret_typed_in_a_frame_or_a_shadow_root_is_drawn_empty(sandboxed, web):
    """The rule that draws a secret field empty lives in the page: in the frame's own document
    and in the shadow root too, where a rule of the main document does not reach."""
    view, _ = run(sandboxed, web,
                  {"browse": f"{web.url}/framed"},
                  {"fill": {"label": "Email", "frame": "#signup", "value": "${code}"}},
                  {"fill": {"label": "Email", "frame": "#signup", "value": ""}},
                  {"browse": f"{web.url}/shadow"},
                  {"fill": {"label": "Member code", "value": "${code}"}},
                  {"fill": {"label": "Member code", "value": ""}},
                  # The component drops its root's style sheets, the secret in its field again.
                  {"fill": {"label": "Member code", "value": "${code}"}},
                  {"click": "#restyle"},
                  {"fill": {"label": "Member code", "value": ""}},
                  {"click": "#restyle"},
                  facts={"code": MEMBER_CODE}, secretFacts=["code"])
    steps = results(sandboxed, view["id"])
    assert [s["data"]["element"].get("secret") for s in (steps[1], steps[4])] == [True, True]
    # Typed, then emptied: the two images are the same, so the typed one showed nothing of it.
    assert artifact(sandboxed, steps[1], "after.png") == artifact(sandboxed, steps[2], "after.png")
    assert artifact(sandboxed, steps[4], "after.png") == artifact(sandboxed, steps[5], "after.png")
    assert artifact(sandboxed, steps[1], "after.png") != artifact(sandboxed, steps[4], "after.png")
    assert artifact(sandboxed, steps[7], "after.png") == artifact(sandboxed, steps[9], "after.png")


def test_a_secret_in_a_frame_whose_page_drops_the_rule_is_still_drawn_empty(sandboxed, web):
    """A frame's page may drop the rule the box keeps in its document, as a component may: every
    image marks each frame again first."""
    restyle = {"click": {"selector": "#restyle", "frame": "#signup"}}
    view, _ = run(sandboxed, web,
                  {"browse": f"{web.url}/framed"},
                  {"fill": {"label": "Email", "frame": "#signup", "value": "${code}"}},
                  restyle,
                  {"fill": {"label": "Email", "frame": "#signup", "value": ""}},
                  restyle,
                  facts={"code": MEMBER_CODE}, secretFacts=["code"])
    steps = results(sandboxed, view["id"])
    # The rule dropped with the secret in the field, then with the field empty: the same image.
    assert artifact(sandboxed, steps[2], "after.png") == artifact(sandboxed, steps[4], "after.png")
    assert artifact(sandboxed, steps[1], "after.png") == artifact(sandboxed, steps[3], "after.png")


def test_wait_for_text_that_appears_later(sandboxed, web):
    _, report = run(sandboxed, web,
                    {"browse": f"{web.url}/late"},
                    {"wait": {"text": "Ready"}, "save": "seen"},
                    {"extract": "#status", "save": "status"})
    assert report["records"]["status"] == [{"value": "Ready: 3 offers"}]
    assert report["records"]["seen"] == "Ready: 3 offers"


def test_a_wait_that_times_out_fails_the_step(sandboxed, web):
    view, _ = run(sandboxed, web, {"browse": f"{web.url}/late"}, {"wait": {"text": "Sold out"}, "timeout_s": 0.5},
                  state="failed")
    assert "waited 0.5 s for text 'Sold out'" in view["error"]


BAGS = {"type": "object", "properties": {"kg": {"type": "number"}}, "required": ["kg"], "additionalProperties": False}


def read_bags(body: dict[str, Any]) -> Answer:
    """Answer from the page text the box sent, as a model reading it would."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    found = re.search(r"Bags: (\d+) kg", prompt.partition("Text of the page:")[2])
    assert found, prompt
    return say(json.dumps({"kg": int(found.group(1))}))


def test_extract_from_plain_words_follows_the_schema(sandboxed, web, model):  # noqa: F811
    model.fallback = read_bags
    view, report = run(sandboxed, web,
                       {"browse": f"{web.url}/terms"},
                       {"extract": {"describe": "the checked bag allowance in kg", "schema": BAGS}, "save": "bags"},
                       budgetCents=100)
    assert report["records"]["bags"] == {"kg": 15} and len(model.received) == 1
    extract = results(sandboxed, view["id"])[1]
    assert extract["data"]["instruction"] == "the checked bag allowance in kg" and extract["data"]["answer"] == {"kg": 15}


def test_extract_from_plain_words_without_a_model_says_it_needs_one(sandboxed, web):
    view, _ = run(sandboxed, web, {"browse": f"{web.url}/terms"}, {"extract": {"describe": "the bag allowance"}},
                  state="failed")
    assert "needs a model to read the page" in view["error"]


def test_the_agent_drives_the_browser_through_its_tools(sandboxed, web, model):  # noqa: F811
    model.answer(call("browser_open", url=f"{web.url}/search"),
                 call("browser_act", action="fill", target={"label": "Search flights"}, value="${route}"),
                 call("browser_act", action="press", target={"label": "Search flights"}, keys="Enter"),
                 call("browser_extract", target="h1"),
                 call("browser_screenshot"),
                 call("finish", answer="found it"))
    task = sandboxed.create(title="agent", prompt="search for my route", hosts=["127.0.0.1"], budgetCents=100,
                            facts={"route": "DEL BOM"})
    view = sandboxed.wait_state(task["id"], "done", "failed", "waiting", timeout=90)
    assert view["state"] == "done", (view, [e["summary"] for e in sandboxed.events(task["id"])])
    assert web.gets["/results"] == 1
    assert "Results for DEL BOM" in model.received[4].messages[-1]["content"]
    events = sandboxed.events(task["id"])
    shots = [a for e in events if e["kind"] == "tool_result" for a in e["artifacts"] if a["type"] == "image/png"]
    assert len(shots) >= 7  # before and after each acting call, and the screenshot


def test_the_agents_browser_stops_in_front_of_a_payment(sandboxed, web, model):  # noqa: F811
    model.answer(call("browser_open", url=f"{web.url}/card"),
                 call("browser_act", action="click", target={"label": "Card number"}),
                 call("browser_act", action="press", keys="Enter"))
    task = sandboxed.create(title="agent", prompt="pay", hosts=["127.0.0.1"], budgetCents=100)
    view = sandboxed.wait_state(task["id"], "done", "failed", "waiting", timeout=90)
    assert (view["state"], view["waitingFor"], view["continuable"]) == ("waiting", "checkpoint", False), view
    assert web.posts == {}
    # The checkpoint keeps the browser on the page until cancel, which ends it.
    assert chromium_of(task["id"])
    uid = uid_of(task["id"])
    assert sandboxed.api.post(f"/api/tasks/{task['id']}/cancel").status_code == 200
    wait_for(lambda: not running_processes_of(uid), timeout=30, what="every process of the task's user to go")

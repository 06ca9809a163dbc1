"""Walls a person must pass (login, captcha, one-time code), payment pages under both modes, and
the browser's release: at a pause and on cancel no Chromium of the task's user remains."""
from __future__ import annotations

from typing import Any

import pytest

from boxsite.core import procs
from tasks.sandbox.accounts import processes_of, running_processes_of
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.pauses.helpers import cont, open_questions, pending_approval
from tests.sandbox.conftest import uid_of

CARD = "4111111111111111"


def chromium_of(task_id: str) -> list[int]:
    """The task user's Chromium processes still alive (one killed but not yet reaped by its
    namespace, a zombie, holds nothing and runs nothing)."""
    uid = uid_of(task_id)
    if uid is None:
        return []
    found = []
    for pid in processes_of(uid):
        if not procs.alive(pid):
            continue
        try:
            with open(f"/proc/{pid}/comm") as handle:
                if "chrom" in handle.read():
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.mark.parametrize(("page", "wall"), [("login", "a login form"), ("captcha", "a captcha"), ("otp", "a one-time-code prompt")])
def test_a_wall_waits_for_a_person_with_a_screenshot_and_continuing_retries_the_step_on_the_same_page(sandboxed, site, page, wall):
    task = sandboxed.create(title=page, hosts=["127.0.0.1"], flow=flow(
        {"browse": f"{site.url}/{page}"}, {"click": {"text": "Continue to checkout"}, "timeout_s": 0.5}))
    view = sandboxed.wait_state(task["id"], "waiting", "failed", timeout=90)
    assert (view["state"], view["waitingFor"]) == ("waiting", "human"), view
    [question] = open_questions(sandboxed, task["id"])
    assert wall in question["prompt"] and question["screenshot"].endswith("-after.png")
    image = sandboxed.api.get(question["screenshot"])
    assert image.status_code == 200 and image["Content-Type"] == "image/png"
    inbox = sandboxed.api.get("/api/inbox").json()
    assert any(q.get("screenshot") == question["screenshot"] for q in inbox["questions"])
    # the waiting task keeps its browser on the wall's page, for a person to pass it
    kept = chromium_of(task["id"])
    assert kept
    assert cont(sandboxed, task["id"], answer="done").status_code == 200
    view = sandboxed.wait_state(task["id"], "waiting", "failed", timeout=90)
    assert view["waitingFor"] == "human"  # the wall is still there: the step ran again and met it
    starts = [e for e in sandboxed.events(task["id"]) if e["kind"] == "step" and e["data"]["step"] == 2]
    assert len(starts) == 2 and site.gets[f"/{page}"] == 1  # on the same page: nothing opened again
    assert chromium_of(task["id"]) == kept


def test_stop_at_payment_types_nothing_and_stops_for_good(sandboxed, site):
    task = sandboxed.create(title="pay", hosts=["127.0.0.1"], facts={"card_number": CARD},
                            flow=flow({"browse": f"{site.url}/pay"}, {"fill": {"label": "Card number", "value": "${card_number}"}},
                                      {"click": {"role": "button", "name": "Pay now"}}))
    view = sandboxed.wait_state(task["id"], "waiting", "failed", timeout=90)
    assert (view["waitingFor"], view["continuable"]) == ("checkpoint", False), view
    assert "payment" in view["step"] or "payment" in str(view)
    assert site.posts["/pay"] == 0
    # The checkpoint holds the browser, on the payment page, until cancel.
    held = chromium_of(task["id"])
    assert held, "the payment checkpoint released its browser"
    uid = uid_of(task["id"])
    assert uid is not None
    assert sandboxed.api.post(f"/api/tasks/{task['id']}/cancel").status_code == 200
    wait_for(lambda: not running_processes_of(uid), timeout=30, what="every process of the task's user to go")
    assert not any(procs.alive(pid) for pid in held)  # killed (a zombie not yet reaped runs nothing)


def test_fill_then_approve_fills_only_on_a_named_origin_and_approval_pays_exactly_once(sandboxed, site):
    steps = flow({"browse": f"{site.url}/pay"}, {"fill": {"label": "Card number", "value": "${card_number}"}},
                 {"fill": {"label": "CVV", "value": "${cvv}"}}, {"click": {"role": "button", "name": "Pay now"}},
                 {"extract": "h1", "save": "after"})
    facts = {"card_number": CARD, "cvv": "123"}
    task = sandboxed.create(title="pay", hosts=["127.0.0.1"], facts=facts, flow=steps,
                            constraints={"payment": "fill_then_approve", "origins": [site.url]})
    view = sandboxed.wait_state(task["id"], "waiting", "failed", timeout=90)
    assert view["waitingFor"] == "approval", view
    approval = pending_approval(sandboxed, task["id"])
    assert approval["kind"] == "payment" and approval["detail"]["origin"] == site.url and approval["screenshot"]
    assert site.posts["/pay"] == 0
    assert chromium_of(task["id"]), "the pause in front of the pay control released its browser"
    assert cont(sandboxed, task["id"], approve=True).status_code == 200
    view = sandboxed.wait_state(task["id"], "done", "failed", timeout=90)
    events = sandboxed.events(task["id"])
    assert view["state"] == "done", (view["error"], [e["summary"] for e in events])
    # The approval pressed the control on the page the first run filled: no page opened again,
    # no field typed again, one press.
    assert site.gets["/pay"] == 1 and site.posts["/pay"] == 1
    assert site.bodies["/pay"] == [{"cardnumber": [CARD], "cvv": ["123"]}]
    assert any(e["data"].get("kept") for e in events if e["kind"] == "note")
    assert not any(e["data"].get("replayed") for e in events if e["kind"] == "note")
    fills = [e for e in events if e["kind"] == "step" and e["data"]["kind"] == "fill"]
    assert len(fills) == 2
    assert CARD not in str(sandboxed.events(task["id"]))

    elsewhere = sandboxed.create(title="pay", hosts=["127.0.0.1"], facts=facts, flow=steps,
                                 constraints={"payment": "fill_then_approve", "origins": ["*"]})
    view = sandboxed.wait_state(elsewhere["id"], "waiting", "failed", timeout=90)
    assert view["state"] == "failed" and "card details are typed only" in view["error"]
    assert site.posts["/pay"] == 1


@pytest.fixture
def cluster_mode(settings: Any) -> None:
    queue_through_the_cluster(settings)


def test_cancel_releases_the_browser(sandboxed, site, cluster_mode, tmp_path):
    with running_box(tmp_path, scheduler=False):
        task = sandboxed.create(title="slow", hosts=["127.0.0.1"], flow=flow(
            {"browse": f"{site.url}/shop"}, {"click": {"text": "never shown"}, "timeout_s": 120}))
        wait_for(lambda: any(e["kind"] == "step" and e["data"]["step"] == 2 for e in sandboxed.events(task["id"])),
                 timeout=90, what="the second step to start")
        assert chromium_of(task["id"])
        uid = uid_of(task["id"])
        assert sandboxed.api.post(f"/api/tasks/{task['id']}/cancel").status_code == 200
        assert uid is not None
        wait_for(lambda: not running_processes_of(uid), timeout=30, what="every process of the task's user to go")
        assert sandboxed.wait_state(task["id"], "cancelled")["state"] == "cancelled"


def test_the_approval_run_attaches_from_another_process_to_the_browser_the_cluster_kept(sandboxed, site, settings, tmp_path):
    """The pause happens in a qcluster worker, which keeps the browser; the approval's run
    executes here, in another process, and presses the pay control on that very page."""
    queue_through_the_cluster(settings)
    steps = flow({"browse": f"{site.url}/pay"}, {"fill": {"label": "Card number", "value": "${card_number}"}},
                 {"click": {"role": "button", "name": "Pay now"}})
    with running_box(tmp_path, scheduler=False):
        task = sandboxed.create(title="pay", hosts=["127.0.0.1"], facts={"card_number": CARD}, flow=steps,
                                constraints={"payment": "fill_then_approve", "origins": [site.url]})
        view = sandboxed.wait_state(task["id"], "waiting", "failed", timeout=90)
        assert view["waitingFor"] == "approval", view
        kept = chromium_of(task["id"])
        assert kept
        settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}  # the next run executes in this process
        assert cont(sandboxed, task["id"], approve=True).status_code == 200
        view = sandboxed.wait_state(task["id"], "done", "failed", timeout=90)
        assert view["state"] == "done", (view["error"], [e["summary"] for e in sandboxed.events(task["id"])])
        assert site.gets["/pay"] == 1 and site.posts["/pay"] == 1
        uid = uid_of(task["id"])
        wait_for(lambda: uid is None or not running_processes_of(uid), timeout=30, what="the kept browser to go with the task")
        assert not any(procs.alive(pid) for pid in kept)

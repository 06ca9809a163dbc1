"""Consequential actions (docs/internals/task-graph.md#consequential-actions): an http step with
stop_before or an irreversible tool goes through an action record, reaches its provider at most
once, keeps a redacted receipt, waits for the owner when its outcome is unknown, and shows in
GET /api/tasks/<id>/actions."""
from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import OperationalError
from django.utils import timezone

from approvals.models import ActionDay
from approvals.presenters import ActionView
from tasks.run import leases as runs
from tasks.workers import flow as flow_worker
from tests.conftest import Box
from tests.factories import flow
from tests.http_server import Handler, serving
from tests.pauses.helpers import open_questions, pending_approval, post

SECRET = "sk-live-4f9a2c7e11d0b3"


class Shop(Handler):
    """An order endpoint that counts every request it receives. ``resets`` requests are cut off
    after they arrived (the connection closes with no answer): an uncertain outcome."""

    calls: list[dict[str, Any]]
    resets = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            type(self).calls.append({"body": body.decode(), "auth": self.headers.get("Authorization", "")})
            cut = len(type(self).calls) <= type(self).resets
        if cut:
            self.close_connection = True
            return
        # The answer echoes what it was sent, secret and all: the receipt must not keep it.
        self.reply(201, json.dumps({"order": len(type(self).calls), "auth": self.headers.get("Authorization", "")}).encode(),
                   {"Content-Type": "application/json"})


@pytest.fixture
def shop() -> Any:
    handler = type("ShopForTest", (Shop,), {"calls": [], "resets": 0})
    with serving(handler) as port:
        handler.url = f"http://127.0.0.1:{port}/orders"
        yield handler


def order_flow(url: str, **extra: Any) -> dict[str, Any]:
    return flow(
        {"http": {"url": url, "method": "POST", "headers": {"Authorization": "Bearer ${api_key}"}, "body": {"item": "lamp"}},
         "stop_before": "this places a real order", "name": "order", "save": "order", **extra},
        {"run": "echo ordered"},
    )


def make_order(box: Box, shop: Any, **spec: Any) -> dict[str, Any]:
    return box.create(title="order a lamp", hosts=["127.0.0.1"], flow=order_flow(shop.url),
                      facts={"api_key": SECRET}, secretFacts=["api_key"], **spec)


def actions_of(box: Box, task_id: str, **params: Any) -> dict[str, Any]:
    response = box.api.get(f"/api/tasks/{task_id}/actions", params)
    assert response.status_code == 200, response.json()
    return response.json()


def approve(box: Box, task_id: str) -> None:
    approval = pending_approval(box, task_id)
    response = post(box, f"/api/approvals/{approval['id']}/approve")
    assert response.status_code == 200, response.json()


def answer(box: Box, question_id: int, text: str) -> Any:
    return post(box, f"/api/questions/{question_id}/answer", {"answer": text})


def test_an_approved_request_is_sent_once_and_keeps_a_redacted_receipt(box: Box, shop: Any) -> None:
    task = make_order(box, shop)
    box.wait_state(task["id"], "waiting")
    (proposed,) = actions_of(box, task["id"])["results"]
    assert proposed["state"] == "proposed" and proposed["kind"] == "http" and proposed["position"] == "step:1"
    assert proposed["policy"]["allowDestructive"] is False and proposed["taskVersion"] >= 1
    asked = pending_approval(box, task["id"])
    assert asked["guard"]["action"] == proposed["id"]
    assert shop.calls == []  # nothing is sent before the owner's OK

    approve(box, task["id"])
    box.wait_state(task["id"], "done")
    assert len(shop.calls) == 1 and shop.calls[0]["auth"] == f"Bearer {SECRET}"  # the provider got the real value
    (done,) = actions_of(box, task["id"])["results"]
    assert done["id"] == proposed["id"] and done["state"] == "succeeded"
    assert done["approval"] == asked["id"]
    assert done["receipt"]["status"] == 201 and done["receipt"]["digest"].startswith("sha256:")
    assert done["attemptedAt"] and done["settledAt"] and done["run"] == 2
    assert done["args"]["headers"]["Authorization"] == "Bearer ${api_key}"
    assert "${api_key}" in done["receipt"]["excerpt"]
    body = json.dumps(actions_of(box, task["id"]))
    assert SECRET not in body and "lease" not in body.lower()


def test_a_resumed_run_answers_from_the_receipt_and_never_calls_again(box: Box, shop: Any, monkeypatch, settings) -> None:
    """A database fault right after the provider answered, before the step's result was recorded:
    the run is handed back and the retry comes to the same step; it finds the action done."""
    settings.BOX_RETRY_BACKOFF_SECONDS = 0
    real = flow_worker.record_result
    faults = []

    def flaky(ctx: Any, index: int, total: int, kind: str, *args: Any, **kwargs: Any) -> None:
        if kind == "http" and not faults:
            faults.append(index)
            raise OperationalError("the database went away")
        real(ctx, index, total, kind, *args, **kwargs)

    monkeypatch.setattr(flow_worker, "record_result", flaky)
    task = make_order(box, shop, constraints={"allow_destructive": True})
    box.wait_state(task["id"], "queued", "running", "done")
    runs.dispatch_due(timezone.now() + timedelta(seconds=60))
    box.wait_state(task["id"], "done")
    assert faults == [0]
    assert len(shop.calls) == 1, shop.calls  # the retry did not send the order again
    (action,) = actions_of(box, task["id"])["results"]
    assert action["state"] == "succeeded" and action["policy"]["allowDestructive"] is True
    results = [e for e in box.events(task["id"]) if e["kind"] == "step_result" and e["data"].get("kind") == "http"]
    assert [r["data"].get("replayed") for r in results] == [True]
    # The log says plainly where the answer came from, and shows what the receipt holds.
    (result,) = results
    assert f"not sent again: answered from the earlier call's receipt (action {action['id']})" in result["summary"]
    assert result["data"]["receipt"] == action["receipt"] and "body" not in result["data"]


def mail_tool(tmp_path: Path, settings: Any) -> Path:
    """An irreversible tool ``mail.send`` that appends a line to the file returned (its effect)."""
    effects = tmp_path / "effects.txt"
    script = tmp_path / "send.sh"
    script.write_text(f"#!/bin/sh\necho sent >> {effects}\necho '{{\"sent\": true}}'\n")
    script.chmod(0o755)
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "mail.send", "command": [str(script)], "irreversible": True,
                                  "schema": {"type": "object", "properties": {"to": {"type": "string"}}}}]))
    settings.BOX_TOOLS_FILE = str(tools)
    return effects


def _fault_once_recording(monkeypatch: Any, step_kind: str) -> list[int]:
    """The database goes away once, right after a ``step_kind`` step acted and before its result
    was recorded: the run is handed back and its retry comes to the same step again."""
    real = flow_worker.record_result
    faults: list[int] = []

    def flaky(ctx: Any, index: int, total: int, kind: str, *args: Any, **kwargs: Any) -> None:
        if kind == step_kind and not faults:
            faults.append(index)
            raise OperationalError("the database went away")
        real(ctx, index, total, kind, *args, **kwargs)

    monkeypatch.setattr(flow_worker, "record_result", flaky)
    return faults


def test_a_resumed_tool_step_says_it_was_answered_from_the_receipt(box: Box, tmp_path: Path, monkeypatch, settings) -> None:
    settings.BOX_RETRY_BACKOFF_SECONDS = 0
    effects = mail_tool(tmp_path, settings)
    faults = _fault_once_recording(monkeypatch, "tool")
    task = box.create(title="mail", tools=["mail.send"], constraints={"allow_destructive": True},
                      flow=flow({"tool": "mail.send", "args": {"to": "a@example.com"}}))
    box.wait_state(task["id"], "queued", "running", "done")
    runs.dispatch_due(timezone.now() + timedelta(seconds=60))
    box.wait_state(task["id"], "done")
    assert faults == [0] and effects.read_text() == "sent\n"  # called once
    (action,) = actions_of(box, task["id"])["results"]
    (result,) = [e for e in box.events(task["id"]) if e["kind"] == "step_result"]
    assert f"mail.send returned; not called again: answered from the earlier call's receipt (action {action['id']})" in result["summary"]
    assert result["data"]["replayed"] is True and result["data"]["receipt"] == action["receipt"]
    assert result["data"]["receipt"]["result"] == {"sent": True}


def _unknown(box: Box, shop: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    shop.resets = 1
    task = make_order(box, shop, constraints={"allow_destructive": True})
    view = box.wait_state(task["id"], "waiting")
    assert view["waitingFor"] == "human"
    (question,) = open_questions(box, task["id"])
    assert question["kind"] == "action" and question["fields"][0]["options"] == ["happened", "did_not_happen", "fail"]
    # It says what happened: the connection was cut after the request went out (no worker stopped).
    assert "is unknown: request failed:" in question["prompt"] and "worker stopped" not in question["prompt"]
    (action,) = actions_of(box, task["id"])["results"]
    assert action["state"] == "unknown" and action["receipt"] is None
    assert len(shop.calls) == 1
    return view, question


def test_an_uncertain_outcome_waits_for_the_owner_and_happened_goes_on_without_calling(box: Box, shop: Any) -> None:
    view, question = _unknown(box, shop)
    assert answer(box, question["id"], "happened").status_code == 200
    box.wait_state(view["id"], "done")
    assert len(shop.calls) == 1
    (action,) = actions_of(box, view["id"])["results"]
    assert action["state"] == "succeeded" and action["reconciliation"]["answer"] == "happened"
    assert action["reconciliation"]["by"] == box.owner.get_username()


def test_did_not_happen_sends_it_once_more(box: Box, shop: Any) -> None:
    view, question = _unknown(box, shop)
    assert answer(box, question["id"], "did_not_happen").status_code == 200
    box.wait_state(view["id"], "done")
    assert len(shop.calls) == 2
    (action,) = actions_of(box, view["id"])["results"]
    assert action["state"] == "succeeded" and action["receipt"]["status"] == 201
    assert action["reconciliation"]["answer"] == "did_not_happen"


def test_fail_ends_the_task_and_nothing_is_sent_again(box: Box, shop: Any) -> None:
    view, question = _unknown(box, shop)
    assert answer(box, question["id"], "fail").status_code == 200
    failed = box.wait_state(view["id"], "failed")
    assert "unknown" in failed["error"]
    assert len(shop.calls) == 1
    (action,) = actions_of(box, view["id"])["results"]
    assert action["state"] == "failed"


def test_an_answer_that_is_not_one_of_the_choices_is_refused(box: Box, shop: Any) -> None:
    view, question = _unknown(box, shop)
    refused = answer(box, question["id"], "maybe")
    assert refused.status_code == 400 and refused.json()["field"] == "answer"
    assert box.task(view["id"])["state"] == "waiting" and len(shop.calls) == 1


def test_cancel_cancels_actions_not_started_and_keeps_unknown_ones(box: Box, shop: Any) -> None:
    waiting = make_order(box, shop)
    box.wait_state(waiting["id"], "waiting")
    view, _ = _unknown(box, shop)
    for task_id in (waiting["id"], view["id"]):
        assert post(box, f"/api/tasks/{task_id}/cancel").status_code == 200
    assert [a["state"] for a in actions_of(box, waiting["id"])["results"]] == ["cancelled"]
    assert [a["state"] for a in actions_of(box, view["id"])["results"]] == ["unknown"]
    assert len(shop.calls) == 1


def test_reaching_the_daily_maximum_tells_the_owner_once_and_stops_nothing(box: Box, shop: Any) -> None:
    response = box.api.patch("/api/settings", {"maxActionsPerDay": 2, "timeZone": "Pacific/Kiritimati"}, format="json")
    assert response.status_code == 200, response.json()
    done = []
    for _ in range(3):
        task = make_order(box, shop, constraints={"allow_destructive": True})
        done.append(box.wait_state(task["id"], "done")["id"])
    assert len(shop.calls) == 3
    notices = [(task_id, e) for task_id in done for e in box.events(task_id) if e["data"].get("notice") == "daily_actions"]
    assert len(notices) == 1 and notices[0][0] == done[1], notices
    assert notices[0][1]["data"]["count"] == 2 and notices[0][1]["data"]["max"] == 2
    owners_day = datetime.now(ZoneInfo("Pacific/Kiritimati")).date()
    assert ActionDay.objects.get().day == owners_day
    shown = box.api.get("/api/settings").json()
    assert (shown["actionsToday"], shown["maxActionsPerDay"], shown["timeZone"]) == (3, 2, "Pacific/Kiritimati")


@pytest.mark.parametrize("body", [{"maxActionsPerDay": 0}, {"maxActionsPerDay": "5"}, {"maxActionsPerDay": 2.5},
                                  {"timeZone": "Mars/Olympus"}, {"timeZone": "../etc/passwd"}, {"timeZone": 3}])
def test_bad_daily_settings_are_refused(box: Box, body: dict[str, Any]) -> None:
    response = box.api.patch("/api/settings", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["field"] == next(iter(body))


def test_no_maximum_is_a_choice(box: Box) -> None:
    response = box.api.patch("/api/settings", {"maxActionsPerDay": None}, format="json")
    assert response.status_code == 200 and response.json()["maxActionsPerDay"] is None


def test_an_irreversible_tool_is_an_action_called_once(box: Box, tmp_path: Path, settings) -> None:
    effects = mail_tool(tmp_path, settings)
    task = box.create(title="mail", tools=["mail.send"], flow=flow({"tool": "mail.send", "args": {"to": "a@example.com"}}))
    box.wait_state(task["id"], "waiting")
    (proposed,) = actions_of(box, task["id"])["results"]
    assert (proposed["kind"], proposed["target"], proposed["state"]) == ("tool", "mail.send", "proposed")
    assert not effects.exists()
    approve(box, task["id"])
    box.wait_state(task["id"], "done")
    assert effects.read_text() == "sent\n"
    (done,) = actions_of(box, task["id"])["results"]
    assert done["state"] == "succeeded" and done["receipt"]["result"] == {"sent": True}


def test_the_actions_page_has_a_cursor_bound_to_its_sort(box: Box, shop: Any) -> None:
    steps = [{"http": {"url": shop.url, "method": "POST", "body": {"n": n}}, "stop_before": "orders"} for n in range(3)]
    task = box.create(title="three orders", hosts=["127.0.0.1"], flow=flow(*steps), constraints={"allow_destructive": True})
    box.wait_state(task["id"], "done")
    first = actions_of(box, task["id"], limit=2)
    assert [a["position"] for a in first["results"]] == ["step:3", "step:2"] and first["next"]
    assert set(first["results"][0]) == set(ActionView.__annotations__)  # the schema describes what is served
    second = actions_of(box, task["id"], limit=2, cursor=first["next"])
    assert [a["position"] for a in second["results"]] == ["step:1"] and second["next"] is None
    oldest = actions_of(box, task["id"], sort="attempted")
    assert [a["position"] for a in oldest["results"]] == ["step:1", "step:2", "step:3"]
    stale = box.api.get(f"/api/tasks/{task['id']}/actions", {"sort": "created", "cursor": first["next"]})
    assert stale.status_code == 400 and stale.json()["field"] == "cursor"
    forged = box.api.get(f"/api/tasks/{task['id']}/actions", {"cursor": first["next"][:-3] + "abc"})
    assert forged.status_code == 400 and forged.json()["field"] == "cursor"
    for bad in ({"sort": "tool"}, {"limit": "0"}, {"limit": "x"}):
        refused = box.api.get(f"/api/tasks/{task['id']}/actions", bad)
        assert refused.status_code == 400 and refused.json()["field"] in bad
    assert box.api.get("/api/tasks/tk0nothere/actions").status_code == 404


def test_the_task_window_shows_actions_with_their_receipts(box: Box, shop: Any, client: Any) -> None:
    task = make_order(box, shop, constraints={"allow_destructive": True})
    box.wait_state(task["id"], "done")
    client.force_login(box.owner)
    page = client.get(f"/tasks/{task['id']}").content.decode()
    section = page[page.index('id="action-records"'):]
    section = section[:section.index("</section>")]
    assert f"POST {shop.url}" in section and "succeeded" in section and "HTTP 201" in section and "sha256:" in section
    assert SECRET not in page


def test_an_action_cancelled_with_a_failure_is_proposed_anew_when_the_task_is_retried(box: Box, shop: Any) -> None:
    steps = [{"write": {"path": "note.txt", "content": "the first action"}}, *order_flow(shop.url)["steps"]]
    task = box.create(title="order a lamp", hosts=["127.0.0.1"], flow=flow(*steps), facts={"api_key": SECRET},
                      secretFacts=["api_key"], limits={"max_actions": 1})
    box.wait_state(task["id"], "waiting")
    approve(box, task["id"])
    failed = box.wait_state(task["id"], "failed")
    assert "max_actions" in failed["error"] and shop.calls == []
    assert [a["state"] for a in actions_of(box, task["id"])["results"]] == ["cancelled"]
    retried = post(box, f"/api/tasks/{task['id']}/retry", {"limits": {"max_actions": 5}})
    assert retried.status_code == 200, retried.json()
    box.wait_state(task["id"], "done")
    assert len(shop.calls) == 1
    (action,) = actions_of(box, task["id"])["results"]
    assert action["state"] == "succeeded" and action["receipt"]["status"] == 201

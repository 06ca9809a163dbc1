"""Notifications: a task that waits for the owner, fails, or is done when they asked to be told
reaches the owner's Apprise URLs (here ``json://`` to a local server), names the task, links to
it, and carries no secret; ``notify.owner`` delivers and says where."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from boxsite.models import BoxSettings
from tasks import notify
from tasks.notify import SENDER
from tests.conftest import wait_for
from tests.factories import flow
from tests.http_server import Handler, serving
from tests.pauses.helpers import pending_approval
from tests.pauses.test_approvals import GUARDED

SECRET = "hunter2-canary-7731"


class Inbox:
    def __init__(self) -> None:
        self.url = ""
        self.messages: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def about(self, task_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [m for m in self.messages if f"/tasks/{task_id}" in m.get("message", "")]

    def wait_about(self, task_id: str, count: int = 1) -> list[dict[str, Any]]:
        return wait_for(lambda: (found := self.about(task_id)) and len(found) >= count and found, timeout=30,
                        what=f"{count} notification(s) about {task_id}")


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[Inbox]:
    received = Inbox()

    class Receiver(Handler):
        def do_POST(self) -> None:  # noqa: N802 - the handler's name for POST
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with received.lock:
                received.messages.append({**json.loads(body), "path": self.path})
            self.reply(200, b"{}", {"Content-Type": "application/json"})

    with serving(Receiver) as port:
        received.url = f"json://127.0.0.1:{port}/hook"
        monkeypatch.setenv("BOX_NOTIFY_URLS", received.url)
        yield received
        SENDER.wait_sent()


def _text(message: dict[str, Any]) -> str:
    return f"{message.get('title', '')}\n{message.get('message', '')}"


def test_an_approval_wait_reaches_the_owner_naming_the_task_and_linking_to_it(box: Any, inbox: Inbox) -> None:
    task = box.create(title=f"renew with {SECRET}", flow=GUARDED, facts={"password": SECRET})
    box.wait_state(task["id"], "waiting")
    [message] = inbox.wait_about(task["id"])
    assert "waits for your approval" in message["title"] and "renew with" in message["title"]
    assert f"/tasks/{task['id']}" in message["message"] and message["path"] == "/hook"
    assert SECRET not in _text(message)


def test_a_question_reaches_the_owner(box: Any, inbox: Inbox) -> None:
    task = box.create(title="needs a city", flow=flow({"run": "echo ${city}", "save": "city"}))
    box.wait_state(task["id"], "waiting")
    [message] = inbox.wait_about(task["id"])
    assert "has a question for you" in message["title"] and "needs a city" in message["title"]


@pytest.mark.parametrize(("step", "words"), [
    ({"checkpoint": "look before going on"}, "waits at a checkpoint for you"),
    ({"run": "echo 'Please verify you are a human: complete the CAPTCHA'; exit 1"}, "needs a person"),
])
def test_a_checkpoint_and_a_wall_reach_the_owner(box: Any, inbox: Inbox, step: dict[str, Any], words: str) -> None:
    task = box.create(title="stopper", flow=flow({"run": "true"}, step))
    box.wait_state(task["id"], "waiting")
    [message] = inbox.wait_about(task["id"])
    assert words in message["title"] and "stopper" in message["title"]


def test_a_failure_reaches_the_owner_without_the_secret_it_printed(box: Any, inbox: Inbox) -> None:
    spec = flow({"run": "echo the password is ${password}; exit 3"})
    task = box.create(title="leaky", flow=spec, facts={"password": SECRET})
    box.wait_state(task["id"], "failed")
    [message] = inbox.wait_about(task["id"])
    assert "“leaky” failed" in message["title"] and f"/tasks/{task['id']}" in message["message"]
    assert SECRET not in _text(message)


def test_done_is_told_only_when_the_owner_asked(box: Any, inbox: Inbox) -> None:
    quiet = box.create(title="quiet", flow=flow({"run": "true"}))
    told = box.create(title="told", flow=flow({"run": "true"}), notify={"done": True})
    assert told["notify"] == {"done": True}
    box.wait_state(quiet["id"], "done")
    box.wait_state(told["id"], "done")
    [message] = inbox.wait_about(told["id"])
    assert "“told” is done" in message["title"]
    SENDER.wait_sent()
    assert inbox.about(quiet["id"]) == []


def test_a_notify_spec_other_than_done_is_refused(box: Any) -> None:
    response = box.api.post("/api/tasks", {"title": "t", "flow": flow({"run": "true"}), "notify": {"daily": 1}},
                            format="json")
    assert response.status_code == 400 and response.json()["field"] == "notify"


def test_the_notify_owner_tool_delivers_and_says_where(box: Any, inbox: Inbox) -> None:
    spec = flow({"tool": "notify.owner", "args": {"message": f"all booked; the code was {SECRET}"}, "save": "sent"})
    task = box.create(title="booker", flow=spec, tools=["notify.owner"], facts={"password": SECRET})
    box.wait_state(task["id"], "done")
    [message] = inbox.wait_about(task["id"])
    assert "all booked" in message["message"] and SECRET not in _text(message)
    result = next(e for e in box.events(task["id"]) if e["kind"] == "tool_result")["data"]["result"]
    assert result["delivered"] is True and result["failed"] == []
    [where] = result["to"]
    assert where.startswith(inbox.url.split("/hook")[0]) and urlsplit(where).path == "/hook"


def test_the_notify_owner_tool_says_when_no_url_is_set(box: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOX_NOTIFY_URLS", raising=False)
    spec = flow({"tool": "notify.owner", "args": {"message": "hello"}})
    task = box.create(title="quiet", flow=spec, tools=["notify.owner"])
    box.wait_state(task["id"], "done")
    result = next(e for e in box.events(task["id"]) if e["kind"] == "tool_result")["data"]["result"]
    assert result["delivered"] is False and result["to"] == [] and "no notification URL" in result["why"]


def test_an_unreachable_service_is_a_note_and_the_task_still_waits(box: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(Handler) as port:
        pass  # a port nobody listens on any more
    monkeypatch.setenv("BOX_NOTIFY_URLS", f"json://127.0.0.1:{port}/gone")
    task = box.create(title="guarded", flow=GUARDED)
    box.wait_state(task["id"], "waiting")
    note = wait_for(lambda: next((e for e in box.events(task["id"]) if "could not notify" in e["summary"]), None),
                    timeout=30, what="the failed delivery's note")
    assert "json://127.0.0.1" in note["summary"]
    assert pending_approval(box, task["id"])["state"] == "pending"


def test_settings_keep_notification_urls_encrypted_show_them_masked_and_use_them(box: Any, inbox: Inbox,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BOX_NOTIFY_URLS")
    with serving(Handler) as port:
        pass
    first = f"json://127.0.0.1:{port}/old"
    token_url = "ntfy://tk_s3cr3t-token-9981@ntfy.example.org/box-alerts"
    response = box.api.patch("/api/settings", {"notifyUrls": [first, token_url]}, format="json")
    assert response.status_code == 200, response.json()
    shown = response.json()["notifyUrls"]
    assert len(shown) == 2 and "tk_s3cr3t-token-9981" not in json.dumps(shown)
    assert b"tk_s3cr3t-token-9981" not in bytes(BoxSettings.objects.get(pk=1).notify_urls_sealed)
    # the masked entry keeps its URL; the other is replaced by the test server's
    receiver = inbox.url
    response = box.api.patch("/api/settings", {"notifyUrls": [shown[1], receiver]}, format="json")
    assert response.status_code == 200, response.json()
    assert notify.stored_urls() == [token_url, receiver]
    task = box.create(title="settings-told", flow=flow({"run": "exit 2"}))
    box.wait_state(task["id"], "failed")
    assert inbox.wait_about(task["id"])


def test_a_url_apprise_cannot_read_is_refused_naming_the_field(box: Any) -> None:
    response = box.api.patch("/api/settings", {"notifyUrls": ["nosuchservice://x"]}, format="json")
    assert response.status_code == 400
    assert response.json()["field"] == "notifyUrls" and "Apprise" in response.json()["message"]
    assert box.api.get("/api/settings").json()["notifyUrls"] == []

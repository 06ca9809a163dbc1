"""The secret canary: a card number, a password, a multi-line private key and its base64, echoed
by a task in commands, errors and files. None of them may appear in any event row, any API
response (task, list, events, report, inbox, approvals, questions, diff, errors), any stored
blocker or run, or any log line the box wrote."""
from __future__ import annotations

import base64
import json
import logging
import secrets
from typing import Any

from approvals.models import Approval, Question
from tasks.models import Run, Task, TaskEvent
from tests.factories import flow
from tests.pauses.helpers import pending_approval

CARD = "4111 1111 1111 1111"
OTHER_CARD = "5555555555554444"  # a card nobody declared: masked as ${card} anyway


def _canaries() -> dict[str, str]:
    key_lines = [base64.b64encode(secrets.token_bytes(48)).decode() for _ in range(6)]
    return {
        "password": f"pw-{secrets.token_hex(8)}",
        "deploy key": "-----BEGIN TEST PRIVATE KEY-----\n" + "\n".join(key_lines) + "\n-----END TEST PRIVATE KEY-----",
        "notes": f"notes-{secrets.token_hex(8)}",  # secret only because the caller says so
    }


def _needles(values: dict[str, str]) -> list[str]:
    """Every form that would betray a canary."""
    key = values["deploy key"]
    needles = [values["password"], values["notes"], CARD, CARD.replace(" ", ""), CARD.replace(" ", "-"), OTHER_CARD]
    needles += [line for line in key.splitlines() if len(line) > 20]
    for raw in (key.encode(), (key + "\n").encode()):
        wrapped = base64.encodebytes(raw).decode()  # what `base64 key.pem` prints
        needles += [line for line in wrapped.splitlines() if len(line) > 20]
        needles.append(base64.b64encode(raw).decode())
    needles.append(base64.b64encode(values["password"].encode()).decode().rstrip("="))
    return needles


def _flow(values: dict[str, str]) -> dict[str, Any]:
    return flow(
        {"run": "echo card ${card number} pw ${password} notes ${notes}", "save": "echoed"},
        {"write": {"path": "key.pem", "content": "${deploy key}"}},
        {"run": "cat key.pem", "save": "key"},
        {"run": "base64 key.pem", "save": "wrapped"},
        {"run": "base64 -w0 key.pem; echo; printf '%s' '${password}' | base64", "save": "encoded"},
        {"write": {"path": "secrets.txt", "content": "${password}\n${card number}\n" + CARD.replace(" ", "") + "\n"}},
        {"run": "cat secrets.txt; echo " + OTHER_CARD + "; echo 4111-1111-1111-1111", "save": "file"},
        {"tool": "notify.owner", "args": {"message": "your password is ${password}"}},
        {"run": "true", "stop_before": f"charge the card {CARD} now"},
        {"run": "echo 'failed using ${password} and ${notes}' >&2; echo ${card number}; exit 3"},
    )


def _hunt(where: str, text: str, needles: list[str]) -> None:
    for needle in needles:
        assert needle not in text, f"a canary leaked into {where}: …{text[max(0, text.find(needle) - 60):text.find(needle) + 60]}…"


def test_no_canary_escapes_anywhere(box, caplog):
    caplog.set_level(logging.DEBUG)
    values = _canaries()
    needles = _needles(values)
    responses: list[tuple[str, str]] = []

    def call(method: str, url: str, body: Any = None) -> Any:
        response = getattr(box.api, method)(url, body, format="json") if method == "post" else box.api.get(url)
        responses.append((f"{method.upper()} {url}", response.content.decode()))
        return response

    facts = {"card number": CARD, **values}
    created = call("post", "/api/tasks", {"title": f"pay with {CARD}", "prompt": f"use {values['password']}",
                                          "flow": _flow(values), "facts": facts, "secretFacts": ["notes"],
                                          "tools": ["notify.owner"]})
    assert created.status_code == 201, created.json()
    task_id = created.json()["id"]
    box.wait_state(task_id, "waiting")
    approval = pending_approval(box, task_id)
    assert approval["summary"] == "charge the card ${card number} now"
    for url in (f"/api/tasks/{task_id}", f"/api/tasks/{task_id}/events?limit=1000", f"/api/tasks/{task_id}/report",
                "/api/inbox", f"/api/approvals/{approval['id']}", f"/api/tasks/{task_id}/diff", "/api/tasks"):
        assert call("get", url).status_code == 200, url
    # Errors echo nothing secret either, even when the caller sends a secret where it does not belong.
    bad = call("post", f"/api/tasks/{task_id}/continue", {"inputs": {CARD.replace(" ", ""): {"x": 1}}})
    assert bad.status_code == 400
    assert call("post", f"/api/tasks/{task_id}/continue", {"approve": True}).status_code == 200
    view = box.wait_state(task_id, "failed")
    assert "exit 3: failed using ${password} and ${notes}" in view["error"]

    records = box.api.get(f"/api/tasks/{task_id}/report").json()["records"]
    assert records["echoed"] == "card ${card number} pw ${password} notes ${notes}"
    assert records["key"] == "${deploy key}"
    assert set(records["wrapped"].splitlines()) == {"${deploy key}"}
    assert records["file"] == "${password}\n${card number}\n${card number}\n${card}\n${card number}"
    for url in (f"/api/tasks/{task_id}", f"/api/tasks/{task_id}/events?limit=1000", f"/api/tasks/{task_id}/report",
                "/api/inbox", f"/api/approvals/{approval['id']}", f"/api/tasks/{task_id}/diff", "/api/tasks"):
        assert call("get", url).status_code == 200, url
    for where, body in responses:
        _hunt(where, body, needles)

    # What the box stored: the action log, blockers, runs, and the task row's own fields.

    for event in TaskEvent.objects.filter(task_id=task_id):
        _hunt(f"event {event.seq}", event.summary + json.dumps(event.data) + json.dumps(event.artifacts), needles)
    for approval_row in Approval.objects.filter(task_id=task_id).values():
        _hunt("an approval row", json.dumps(approval_row, default=str), needles)
    for question_row in Question.objects.filter(task_id=task_id).values():
        _hunt("a question row", json.dumps(question_row, default=str), needles)
    for run_row in Run.objects.filter(task_id=task_id).values("error", "outcome", "resume"):
        _hunt("a run row", json.dumps(run_row, default=str), needles)
    row = Task.objects.filter(pk=task_id).values("facts", "error", "hint", "step", "pause", "records", "resume").get()
    _hunt("the task row (secret facts are sealed at rest)", json.dumps(row, default=str), needles)

    for record in caplog.records:
        _hunt(f"log line from {record.name}", record.getMessage() + (record.exc_text or ""), needles)


def test_a_command_worker_echoing_secrets_is_masked_too(box, caplog):
    caplog.set_level(logging.DEBUG)
    password = f"pw-{secrets.token_hex(8)}"
    script = f"echo logged in with {password}; echo {CARD.replace(' ', '')} >&2; exit 4"
    task = box.create(title="cmd", prompt="echo", worker="command", command=["sh", "-c", script], facts={"password": password})
    view = box.wait_state(task["id"], "failed")
    assert view["error"] == "worker exited with 4: ${card}"
    bodies = [box.api.get(f"/api/tasks/{task['id']}").content.decode(),
              box.api.get(f"/api/tasks/{task['id']}/events").content.decode(),
              box.api.get(f"/api/tasks/{task['id']}/report").content.decode()]
    assert "logged in with ${password}" in bodies[1]
    for body in bodies:
        _hunt("a response", body, [password, CARD.replace(" ", "")])

    for event in TaskEvent.objects.filter(task_id=task["id"]):
        _hunt("an event", event.summary + json.dumps(event.data), [password, CARD.replace(" ", "")])
    for record in caplog.records:
        _hunt("a log line", record.getMessage(), [password, CARD.replace(" ", "")])

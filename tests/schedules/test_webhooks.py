"""Webhook triggers through the public endpoint: only correctly signed raw bodies start a task,
each delivery at most once."""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from schedules.models import Trigger
from schedules.signatures import github_header, timestamped_header
from tasks.models import Task
from tests.conftest import Box
from tests.schedules.conftest import tasks_from

GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_BODY = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
TEMPLATE = {"title": "triage ${payload.action} #${payload.number}", "prompt": "look at ${payload.issue.title}"}


def make_hook(box: Box, name: str = "github", **body: Any) -> dict[str, Any]:
    body.setdefault("template", TEMPLATE)
    response = box.api.post("/api/triggers", {"name": name, "kind": "webhook", **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def deliver(hook: dict[str, Any], body: bytes, content_type: str = "application/json", **headers: str) -> Any:
    # A client that would enforce CSRF for a browser: the webhook must not need it.
    return Client(enforce_csrf_checks=True).post(hook["path"], data=body, content_type=content_type, **headers)


def sig_headers(secret: str, body: bytes, delivery: str | None = None) -> dict[str, str]:
    headers = {"HTTP_X_HUB_SIGNATURE_256": github_header(secret, body)}
    if delivery:
        headers["HTTP_X_GITHUB_DELIVERY"] = delivery
    return headers


ISSUE = {"action": "opened", "number": 42, "issue": {"title": "Crash on start", "labels": [{"name": "bug"}]}, "draft": False}


def test_githubs_published_test_vector_verifies(box: Box) -> None:
    hook = make_hook(box, secret=GITHUB_SECRET, template={"title": "ping", "prompt": "echo ${payload}"})
    response = deliver(hook, GITHUB_BODY, content_type="text/plain", HTTP_X_HUB_SIGNATURE_256=GITHUB_SIGNATURE)
    assert response.status_code == 202, response.json()
    task = box.task(response.json()["task"])
    assert task["source"] == "webhook:github"
    assert task["facts"]["payload"] == "Hello, World!" and task["prompt"] == "echo Hello, World!"


def test_the_json_payload_reaches_the_task_as_facts(box: Box) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    response = deliver(hook, body, HTTP_X_GITHUB_EVENT="issues", **sig_headers(hook["secret"], body, "d-1"))
    assert response.status_code == 202, response.json()
    task = box.task(response.json()["task"])
    facts = task["facts"]
    assert facts["payload.action"] == "opened" and facts["payload.number"] == "42"
    assert facts["payload.issue.labels.0.name"] == "bug" and facts["payload.draft"] == "false"
    assert facts["webhook.event"] == "issues" and facts["webhook.delivery"] == "d-1"
    assert json.loads(facts["payload"]) == ISSUE
    assert task["title"] == "triage opened #42" and task["prompt"] == "look at Crash on start"


def test_a_secret_looking_payload_value_is_redacted_and_not_put_in_the_prompt(box: Box) -> None:
    hook = make_hook(box, template={"title": "deploy", "prompt": "use ${payload.token}"})
    body = json.dumps({"token": "ghp_supersecretvalue123"}).encode()
    response = deliver(hook, body, **sig_headers(hook["secret"], body, "d-secret"))
    task = box.task(response.json()["task"])
    assert "ghp_supersecretvalue123" not in json.dumps(task)
    assert task["prompt"] == "use ${payload.token}"


@pytest.mark.parametrize("attack", ["flipped byte", "missing header", "sha1 prefix", "reserialised json",
                                    "wrong secret", "garbage header"])
def test_a_bad_signature_gets_403_and_starts_nothing(box: Box, attack: str) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    good = github_header(hook["secret"], body)
    headers: dict[str, str] = {"HTTP_X_GITHUB_DELIVERY": f"d-{attack}"}
    if attack == "flipped byte":
        body = body.replace(b"opened", b"openee")
        headers["HTTP_X_HUB_SIGNATURE_256"] = good
    elif attack == "sha1 prefix":
        headers["HTTP_X_HUB_SIGNATURE_256"] = good.replace("sha256=", "sha1=")
    elif attack == "reserialised json":
        headers["HTTP_X_HUB_SIGNATURE_256"] = good
        body = json.dumps(json.loads(body), indent=2).encode()  # the same JSON, other bytes
    elif attack == "wrong secret":
        headers["HTTP_X_HUB_SIGNATURE_256"] = github_header("not-the-secret-at-all", body)
    elif attack == "garbage header":
        headers["HTTP_X_HUB_SIGNATURE_256"] = "sha256=zz"
    response = deliver(hook, body, **headers)
    assert response.status_code == 403
    assert response.json()["code"] == "FORBIDDEN" and response.json()["field"] == "signature"
    assert Task.objects.count() == 0


@pytest.mark.parametrize(("offset", "accepted"), [(-301, False), (301, False), (-290, True), (290, True)])
def test_a_timestamped_signature_is_accepted_only_within_five_minutes(box: Box, offset: int, accepted: bool) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    stamp = int(time.time()) + offset
    response = deliver(hook, body, HTTP_X_BOX_SIGNATURE=timestamped_header(hook["secret"], body, stamp))
    assert response.status_code == (202 if accepted else 403), response.json()
    assert Task.objects.count() == (1 if accepted else 0)


def test_a_timestamped_signature_covers_the_timestamp(box: Box) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    stamp = int(time.time())
    header = timestamped_header(hook["secret"], body, stamp - 1000)  # a stale signature...
    forged = header.replace(f"t={stamp - 1000}", f"t={stamp}")  # ...with a fresh timestamp pasted in
    assert deliver(hook, body, HTTP_X_BOX_SIGNATURE=forged).status_code == 403
    assert Task.objects.count() == 0


def test_a_replayed_delivery_answers_200_and_starts_no_second_task(box: Box) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    first = deliver(hook, body, **sig_headers(hook["secret"], body, "abc-123"))
    again = deliver(hook, body, **sig_headers(hook["secret"], body, "abc-123"))
    assert first.status_code == 202 and again.status_code == 200
    assert again.json() == {"task": first.json()["task"], "delivery": "abc-123", "duplicate": True}
    # A timestamped request with no delivery id is deduplicated by its signature.
    stamped = {"HTTP_X_BOX_SIGNATURE": timestamped_header(hook["secret"], body, int(time.time()))}
    assert deliver(hook, body, **stamped).status_code == 202
    assert deliver(hook, body, **stamped).status_code == 200
    assert len(tasks_from(box, "webhook:github")) == 2


def test_a_timestamped_request_replayed_under_a_new_delivery_header_starts_no_second_task(box: Box) -> None:
    # The attack: capture a signed request and send it again within the tolerance window with a
    # fresh, unsigned X-Box-Delivery each time.
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    signature = timestamped_header(hook["secret"], body, int(time.time()))
    first = deliver(hook, body, HTTP_X_BOX_SIGNATURE=signature, HTTP_X_BOX_DELIVERY="d-1")
    assert first.status_code == 202, first.json()
    assert box.task(first.json()["task"])["facts"]["webhook.delivery"] == "d-1"
    for replay_id in ("d-2", "d-3", ""):
        headers = {"HTTP_X_BOX_SIGNATURE": signature, **({"HTTP_X_BOX_DELIVERY": replay_id} if replay_id else {})}
        again = deliver(hook, body, **headers)
        assert again.status_code == 200 and again.json()["duplicate"] is True, again.json()
        assert again.json()["task"] == first.json()["task"]
    # The same body signed afresh (a new timestamp) is a new delivery.
    later = timestamped_header(hook["secret"], body, int(time.time()) + 1)
    assert deliver(hook, body, HTTP_X_BOX_SIGNATURE=later, HTTP_X_BOX_DELIVERY="d-1").status_code == 202
    assert len(tasks_from(box, "webhook:github")) == 2


def test_two_copies_of_one_delivery_arriving_at_once_start_one_task(box: Box) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    headers = sig_headers(hook["secret"], body, "simultaneous")
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def send() -> None:
        try:
            barrier.wait(timeout=10)
            codes.append(deliver(hook, body, **headers).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(codes) == [200, 202]
    assert Task.objects.count() == 1


def test_during_rotation_both_secrets_verify_until_it_is_finished(box: Box) -> None:
    hook = make_hook(box)
    old = hook["secret"]
    rotated = box.api.post(f"/api/triggers/{hook['id']}/rotate", {}, format="json").json()
    new = rotated["secret"]
    assert new != old and rotated["rotating"] is True
    assert "secret" not in box.api.get(f"/api/triggers/{hook['id']}").json()  # shown once only
    body = json.dumps(ISSUE).encode()
    assert deliver(hook, body, **sig_headers(old, body, "r-1")).status_code == 202
    assert deliver(hook, body, **sig_headers(new, body, "r-2")).status_code == 202

    finished = box.api.post(f"/api/triggers/{hook['id']}/rotate/finish").json()
    assert finished["rotating"] is False
    assert deliver(hook, body, **sig_headers(old, body, "r-3")).status_code == 403
    assert deliver(hook, body, **sig_headers(new, body, "r-4")).status_code == 202
    assert Task.objects.count() == 3


def test_an_oversized_body_gets_413_and_starts_nothing(box: Box, settings: Any) -> None:
    hook = make_hook(box)
    body = b'{"x": "' + b"a" * settings.BOX_WEBHOOK_MAX_BYTES + b'"}'
    response = deliver(hook, body, **sig_headers(hook["secret"], body, "big"))
    assert response.status_code == 413 and response.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert Task.objects.count() == 0


def test_an_unknown_address_a_paused_hook_and_a_get_start_nothing(box: Box) -> None:
    hook = make_hook(box)
    body = json.dumps(ISSUE).encode()
    assert Client().post("/hooks/not-a-token", data=body, content_type="application/json",
                         **sig_headers(hook["secret"], body)).status_code == 404
    assert Client().get(hook["path"]).status_code == 405
    box.api.post(f"/api/triggers/{hook['id']}/pause")
    assert deliver(hook, body, **sig_headers(hook["secret"], body, "p-1")).status_code == 409
    assert Task.objects.count() == 0


def test_the_secret_is_stored_encrypted_not_in_the_clear(box: Box) -> None:
    hook = make_hook(box)
    row = Trigger.objects.get(pk=hook["id"])
    assert hook["secret"].encode() not in bytes(row.secret_ciphertext)
    assert hook["url"].endswith(hook["path"]) and len(hook["path"]) > 40

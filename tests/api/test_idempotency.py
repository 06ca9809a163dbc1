"""Idempotent creation: a client that repeats a create with the same ``Idempotency-Key`` (after a
timeout, a lost answer) gets what the first request made, and nothing is made twice, on SQLite
and PostgreSQL alike, also when the two requests arrive at once."""
from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from boxsite.models import IdempotencyKey
from schedules.models import Schedule, Trigger
from schedules.system import run_job
from tasks.models import Task
from tests.conftest import Box, queue_through_the_cluster, wait_for
from tests.schema_check import box_schema

TASK = {"title": "summarise", "prompt": "summarise the notes"}
SCHEDULE = {"name": "nightly", "intervalSeconds": 3600, "template": {"title": "t", "prompt": "p"}}
TRIGGER = {"name": "github", "kind": "webhook", "template": {"title": "t", "prompt": "p"}}


@pytest.fixture(autouse=True)
def _queued_only(settings: Any) -> None:
    # The created tasks only need to exist; running them is not what is tested here.
    queue_through_the_cluster(settings)


def post(client: APIClient, path: str, body: dict[str, Any], key: str | None) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(path, body, format="json", **headers)


def test_the_same_key_and_body_answer_the_first_task_and_create_no_second(box: Box) -> None:
    first = post(box.api, "/api/tasks", TASK, "retry-1")
    again = post(box.api, "/api/tasks", {"prompt": "summarise the notes", "title": "summarise"}, "retry-1")
    assert first.status_code == again.status_code == 201, again.json()
    assert again.json()["id"] == first.json()["id"]
    assert "Idempotent-Replayed" not in first and again["Idempotent-Replayed"] == "true"
    assert Task.objects.count() == 1


def test_the_same_key_with_another_body_is_a_conflict_naming_the_key(box: Box) -> None:
    assert post(box.api, "/api/tasks", TASK, "retry-2").status_code == 201
    response = post(box.api, "/api/tasks", {**TASK, "title": "something else"}, "retry-2")
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "IDEMPOTENCY_KEY_REUSED" and "'retry-2'" in body["message"]
    assert body["field"] == "Idempotency-Key"
    assert Task.objects.count() == 1


def test_without_a_key_each_request_creates(box: Box) -> None:
    ids = {post(box.api, "/api/tasks", TASK, None).json()["id"] for _ in range(2)}
    assert len(ids) == 2 and Task.objects.count() == 2


def test_a_key_past_24_hours_creates_again_and_the_retention_job_forgets_old_keys(box: Box) -> None:
    first = post(box.api, "/api/tasks", TASK, "daily")
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=24, minutes=1))
    second = post(box.api, "/api/tasks", TASK, "daily")
    assert second.status_code == 201 and "Idempotent-Replayed" not in second
    assert second.json()["id"] != first.json()["id"] and Task.objects.count() == 2

    post(box.api, "/api/tasks", TASK, "another")
    IdempotencyKey.objects.filter(key="daily").update(created_at=timezone.now() - timedelta(days=2))
    run_job({"title": "retention", "job": "retention"})
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["another"]


def test_a_failed_creation_takes_no_key(box: Box) -> None:
    refused = post(box.api, "/api/tasks", {"title": "t"}, "fix-and-retry")  # neither prompt nor flow
    assert refused.status_code == 400
    fixed = post(box.api, "/api/tasks", TASK, "fix-and-retry")
    assert fixed.status_code == 201 and "Idempotent-Replayed" not in fixed


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there", "bell\x07", "del\x7f"])
def test_a_key_that_is_not_1_to_255_printable_ascii_characters_is_refused(box: Box, key: str) -> None:
    response = post(box.api, "/api/tasks", TASK, key)
    assert response.status_code == 400
    assert response.json()["code"] == "INVALID_REQUEST" and response.json()["field"] == "Idempotency-Key"
    assert Task.objects.count() == 0


def test_the_longest_key_is_taken(box: Box) -> None:
    key = "~ !" * 85
    assert post(box.api, "/api/tasks", TASK, key).json()["id"] == post(box.api, "/api/tasks", TASK, key).json()["id"]


def test_another_callers_key_is_its_own(box: Box) -> None:
    _, raw = issue_api_token(box.owner, "another program")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    mine = post(box.api, "/api/tasks", TASK, "1").json()["id"]
    theirs = post(other, "/api/tasks", {**TASK, "title": "their own"}, "1")
    assert theirs.status_code == 201 and theirs.json()["id"] != mine
    assert post(other, "/api/tasks", {**TASK, "title": "their own"}, "1").json()["id"] == theirs.json()["id"]


def test_schedule_creation_is_idempotent(box: Box) -> None:
    first = post(box.api, "/api/schedules", SCHEDULE, "s-1")
    again = post(box.api, "/api/schedules", SCHEDULE, "s-1")
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert Schedule.objects.filter(system=False).count() == 1
    other = post(box.api, "/api/schedules", {**SCHEDULE, "intervalSeconds": 60}, "s-1")
    assert other.status_code == 409 and "'s-1'" in other.json()["message"]


def test_trigger_creation_is_idempotent_and_the_replay_carries_the_secret(box: Box) -> None:
    first = post(box.api, "/api/triggers", TRIGGER, "t-1")
    again = post(box.api, "/api/triggers", TRIGGER, "t-1")
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert again.json()["secret"] == first.json()["secret"]  # the caller may never have seen the first answer
    assert Trigger.objects.count() == 1
    assert post(box.api, "/api/triggers", {**TRIGGER, "paused": True}, "t-1").status_code == 409


def test_a_replay_of_something_gone_is_a_conflict(box: Box) -> None:
    made = post(box.api, "/api/schedules", SCHEDULE, "s-2").json()
    assert box.api.delete(f"/api/schedules/{made['id']}").status_code == 204
    response = post(box.api, "/api/schedules", SCHEDULE, "s-2")
    assert response.status_code == 409 and "'s-2'" in response.json()["message"]


def test_two_requests_with_one_key_at_once_create_one_task(box: Box) -> None:
    callers = 4
    barrier = threading.Barrier(callers)
    answers: list[tuple[int, str | None, bool]] = []

    def send() -> None:
        client = APIClient()  # each thread has a database connection of its own
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {box.token}")
        try:
            barrier.wait(timeout=10)
            response = post(client, "/api/tasks", TASK, "at-once")
            answers.append((response.status_code, response.json().get("id"), response.has_header("Idempotent-Replayed")))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(callers)]
    for thread in threads:
        thread.start()
    wait_for(lambda: not any(t.is_alive() for t in threads), timeout=60, what="the requests to be answered")
    assert [status for status, _, _ in answers] == [201] * callers, answers
    assert len({task_id for _, task_id, _ in answers}) == 1
    assert sorted(replayed for _, _, replayed in answers) == [False] + [True] * (callers - 1)
    assert Task.objects.count() == 1


@pytest.mark.parametrize("path", ["/api/tasks", "/api/schedules", "/api/triggers"])
def test_the_schema_declares_the_header_and_the_conflict(path: str) -> None:
    operation = box_schema().document["paths"][path]["post"]
    headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
    assert "Idempotency-Key" in headers
    assert "IDEMPOTENCY_KEY_REUSED" in operation["responses"]["409"]["description"]
    assert "Idempotent-Replayed" in operation["responses"]["201"]["headers"]

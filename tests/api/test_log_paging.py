"""A long task log pages in constant time: each page of a task's actions starts at its cursor in
an index (never sorting or skipping the rows before it), every row comes exactly once, and a
cursor or position the box did not make is refused in the error shape."""
from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.actions import policy_of
from approvals.models import Action, ActionState
from tasks.models import Task
from tests.api.test_edges import assert_error
from tests.conftest import Box
from tests.factories import flow

ACTIONS = 600


def long_log(box: Box) -> str:
    """A finished task with ``ACTIONS`` actions, three to each timestamp (ties at page edges)."""
    task = box.create(title="a long log", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
    box.wait_state(task["id"], "done")
    field = Action._meta.get_field("created_at")
    field.auto_now_add = False  # type: ignore[attr-defined]
    try:
        base = timezone.now() - timedelta(hours=1)
        policy = policy_of(Task.objects.get(pk=task["id"]))  # as the box proposes each action
        Action.objects.bulk_create([
            Action(task_id=task["id"], tool="t", position=f"step:{i}", idempotency_key=f"{task['id']}-{i}", policy=policy,
                   state=ActionState.SUCCEEDED, created_at=base + timedelta(seconds=i // 3)) for i in range(ACTIONS)])
    finally:
        field.auto_now_add = True  # type: ignore[attr-defined]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE approvals_action")
    return str(task["id"])


def pages(box: Box, task_id: str, sort: str) -> list[list[str]]:
    out, cursor = [], None
    while True:
        params = {"sort": sort, "limit": 50, **({"cursor": cursor} if cursor else {})}
        body = box.api.get(f"/api/tasks/{task_id}/actions", params).json()
        out.append([a["position"] for a in body["results"]])
        cursor = body["next"]
        if not cursor:
            return out


def test_every_action_comes_once_in_order_across_pages_with_tied_timestamps(box: Box) -> None:
    task_id = long_log(box)
    newest_first = [p for page in pages(box, task_id, "-created") for p in page]
    assert newest_first == [f"step:{i}" for i in reversed(range(ACTIONS))]
    oldest_first = [p for page in pages(box, task_id, "created") for p in page]
    assert oldest_first == [f"step:{i}" for i in range(ACTIONS)]


def _plan(sql: str) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Whatever a small table's statistics suggest: can the index alone give this page?
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("EXPLAIN " + sql)
            return "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def test_a_page_deep_in_a_tasks_actions_starts_at_its_cursor_in_the_index(box: Box) -> None:
    task_id = long_log(box)
    body = box.api.get(f"/api/tasks/{task_id}/actions", {"limit": 50}).json()
    for _ in range(5):
        body = box.api.get(f"/api/tasks/{task_id}/actions", {"limit": 50, "cursor": body["next"]}).json()
    with CaptureQueriesContext(connection) as queries:
        deep = box.api.get(f"/api/tasks/{task_id}/actions", {"limit": 50, "cursor": body["next"]}).json()
    assert deep["results"][0]["position"] == f"step:{ACTIONS - 1 - 300}"
    (sql,) = [q["sql"] for q in queries.captured_queries if 'FROM "approvals_action"' in q["sql"] and "LIMIT" in q["sql"]]
    plan = _plan(sql)
    assert "action_task_created" in plan, plan
    if connection.vendor == "postgresql":
        assert "Sort" not in plan, plan  # the order comes from the index
        cond = next(line for line in plan.splitlines() if "Index Cond" in line)
        assert "created_at" in cond, plan  # the scan starts at the cursor, not at the newest row
    else:
        assert "TEMP B-TREE" not in plan, plan
        assert "created_at<" in plan.replace(" ", ""), plan


def _forged(payload: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


def test_a_cursor_or_position_the_box_did_not_make_is_refused_in_the_error_shape(box: Box) -> None:
    task_id = long_log(box)
    actions = f"/api/tasks/{task_id}/actions"
    real = box.api.get(actions, {"limit": 50}).json()["next"]
    for cursor in ("garbage", real[:-4] + "abcd", _forged({"sort": "-created", "v": "2020-01-01", "pk": 1}),
                   real + "x", "%00", "a" * 5000):
        assert_error(box.api.get(actions, {"cursor": cursor}), 400, "INVALID_REQUEST", "cursor")
    assert_error(box.api.get(actions, {"cursor": real, "sort": "created"}), 400, "INVALID_REQUEST", "cursor")
    events = f"/api/tasks/{task_id}/events"
    for after in ("-1", "x", "1e3", "%00"):
        assert_error(box.api.get(events, {"after": after}), 400, "INVALID_REQUEST", "after")
    beyond = box.api.get(events, {"after": str(2**70)})  # past any seq: an empty page, not a database error
    assert beyond.status_code == 200 and beyond.json()["events"] == [], beyond.content[:300]

"""Undoing a layer that a running task reads: the stack changes at once, the files go later."""
from __future__ import annotations

import threading
from typing import Any

from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

from tests.conftest import wait_for
from tests.factories import flow
from tests.layers.conftest import diff_of, read, undo


def _create_in_background(token: str, spec: dict[str, Any]) -> threading.Thread:
    """Runs execute inline after commit, so a blocking task's POST blocks: post from a thread."""

    def post() -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
            client.post("/api/tasks", spec, format="json")
        finally:
            connection.close()

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def test_undo_of_a_layer_a_running_task_reads_is_deferred_until_that_task_ends(lbox):
    a = lbox.create(title="A", flow=flow({"write": {"path": "a.txt", "content": "from A\n"}}))
    lbox.wait_state(a["id"], "done")
    layer_of_a = settings.BOX_DATA_DIR / "layers" / a["id"]

    # B waits (inside its sandbox, so on a file in its own view) until the test lets it go
    thread = _create_in_background(lbox.token, {"title": "B", "flow": flow(
        {"run": "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; cat a.txt > seen.txt"})})

    def running_b() -> dict[str, Any] | None:
        rows = lbox.api.get("/api/tasks", {"state": "running"}).json()["results"]
        return rows[0] if rows and (settings.BOX_DATA_DIR / "tasks" / rows[0]["id"] / "view").is_dir() else None

    b = wait_for(running_b, what="B to be running in its view")
    assert b["layers"] == [a["id"]]

    undo(lbox, a["id"])
    assert read(lbox, "a.txt") is None  # gone from the workspace at once
    fresh = lbox.create(title="fresh", flow=flow({"run": "test ! -e a.txt"}))
    assert lbox.wait_state(fresh["id"], "done", "failed")["state"] == "done"
    assert layer_of_a.is_dir()  # still read by B

    (settings.BOX_DATA_DIR / "tasks" / b["id"] / "view" / "go").write_text("")
    b = lbox.wait_state(b["id"], "done", "failed")
    thread.join(timeout=30)
    assert b["state"] == "done", b["error"]
    assert "+from A" in diff_of(lbox, b["id"])["diff"]  # B read A's file after A was undone
    assert read(lbox, "seen.txt") == "from A\n"  # B's own change joined the workspace
    wait_for(lambda: not layer_of_a.exists(), what="A's layer to be deleted once B ended")

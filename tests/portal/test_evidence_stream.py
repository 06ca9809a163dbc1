"""A step's evidence reaches the task's live stream as it reaches the API: the result event with
its exit code, output tails and artifacts, on both stream transports."""
from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async

from tests.factories import flow
from tests.portal.conftest import session_cookie, ws
from tests.portal.test_live import frames_until, is_ready

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio,
              pytest.mark.usefixtures("stream_connections_closed")]


async def test_a_run_steps_result_is_on_the_stream_with_its_output_and_artifacts(box: Any, transport: str) -> None:
    task = await database_sync_to_async(box.create)(title="evidence", flow=flow({"run": "echo built; echo warn >&2; exit 0"}))
    await database_sync_to_async(box.wait_state)(task["id"], "done")
    client = ws(f"/ws/tasks/{task['id']}/?after=0", session=await database_sync_to_async(session_cookie)(box.owner))
    connected, _ = await client.connect()
    assert connected
    try:
        frames = await frames_until(client, is_ready)
    finally:
        await client.disconnect()
    streamed = [f["event"] for f in frames if f["type"] == "event" and f["event"]["kind"] == "step_result"]
    assert len(streamed) == 1, frames
    result = streamed[0]
    assert (result["data"]["step"], result["data"]["exitCode"]) == (1, 0)
    assert result["data"]["stdout"] == "built" and result["data"]["stderr"] == "warn"
    names = sorted(a["name"] for a in result["artifacts"])
    assert names == ["step-1-run-1-stderr.txt", "step-1-run-1-stdout.txt"], result["artifacts"]
    assert all(a["url"] == f"/api/tasks/{task['id']}/artifacts/{a['name']}" for a in result["artifacts"])
    assert result == next(e for e in await database_sync_to_async(box.events)(task["id"]) if e["kind"] == "step_result")

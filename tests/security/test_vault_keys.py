"""Attack: vault keys printed by the process that was given them. A preset's key printed after a
``box ask`` (the redactor used to be rebuilt from facts alone then), and a command tool's vault
keys (never redacted before), must not appear in clear anywhere: task view, list, report,
events, WebSocket frames, database rows, or the worker's log.

A real django-q2 cluster runs the task (so the test can answer while the process waits), the
process runs in the real sandbox, and the stream is read through the real ASGI application.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from approvals.models import Question
from tasks.models import Run, Task, TaskEvent
from tests.cluster import running_box
from tests.conftest import Box, queue_through_the_cluster, wait_for
from tests.portal.conftest import session_cookie, ws

pytestmark = [pytest.mark.django_db(transaction=True)]

PRESET_SCRIPT = r"""
echo "before the question: $MY_API_KEY"
colour=$(box ask colour --why 'pick one')
echo "after the question ($colour): $MY_API_KEY"
printf %s "$MY_API_KEY" | base64
box step "stepping with $MY_API_KEY"
box tool owner.leaky --args '{}'
box tool owner.leaky_fails --args '{}' || true
echo "giving up with $MY_API_KEY" >&2
exit 3
"""


@pytest.fixture(scope="module")
def owner_files() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="box-vault-keys-"))
    os.chmod(base, 0o755)
    (base / "presets.json").write_text(json.dumps([
        {"name": "leaky", "argv": ["/bin/sh", "-c", PRESET_SCRIPT], "keys": ["MY_API_KEY"]}]))
    (base / "tools.json").write_text(json.dumps([
        {"name": "owner.leaky", "keys": ["TOOL_KEY"], "schema": {"type": "object"},
         "command": ["/bin/sh", "-c", 'printf \'{"token used": "%s"}\' "$TOOL_KEY"; echo "tool log $TOOL_KEY" >&2']},
        {"name": "owner.leaky_fails", "keys": ["TOOL_KEY"], "schema": {"type": "object"},
         "command": ["/bin/sh", "-c", 'echo "refused for $TOOL_KEY" >&2; exit 2']},
    ]))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def worker_log(django_db_setup: Any, django_db_blocker: Any, owner_files: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    logs = tmp_path_factory.mktemp("cluster")
    with django_db_blocker.unblock(), running_box(logs, scheduler=False, BOX_WORKERS="2",
                                                  BOX_PRESETS_FILE=str(owner_files / "presets.json"),
                                                  BOX_TOOLS_FILE=str(owner_files / "tools.json")):
        log = logs / "qcluster.log"
        # A job sent while the cluster still forks its processes can meet a connection they share.
        wait_for(lambda: log.exists() and "running." in log.read_text(errors="replace"), timeout=60,
                 what="the cluster to be running")
        yield log


@pytest.fixture
def keys(box: Box, settings: Any, owner_files: Path, worker_log: Path) -> dict[str, str]:
    queue_through_the_cluster(settings)
    settings.BOX_PRESETS_FILE = str(owner_files / "presets.json")
    settings.BOX_TOOLS_FILE = str(owner_files / "tools.json")
    values = {"MY_API_KEY": f"sk-preset-{secrets.token_hex(12)}", "TOOL_KEY": f"tk-tool-{secrets.token_hex(12)}"}
    for name, value in values.items():
        assert box.api.post("/api/vault", {"name": name, "value": value}, format="json").status_code == 201
    return values


def _needles(keys: dict[str, str]) -> list[str]:
    needles = list(keys.values())
    needles += [base64.b64encode(v.encode()).decode().rstrip("=") for v in keys.values()]
    return needles


def _hunt(where: str, text: str, needles: list[str]) -> None:
    for needle in needles:
        at = text.find(needle)
        assert at < 0, f"a vault key leaked into {where}: …{text[max(0, at - 60):at + 60]}…"


async def test_no_vault_key_a_process_or_tool_prints_reaches_the_log(box: Box, keys: dict[str, str], worker_log: Path,
                                                                    stream_connections_closed: None) -> None:
    needles = _needles(keys)
    task = await database_sync_to_async(box.create)(title="leaky", worker="leaky", prompt="p", tools=["owner.leaky", "owner.leaky_fails"])
    task_id = task["id"]
    client = ws(f"/ws/tasks/{task_id}/?after=0", session=await database_sync_to_async(session_cookie)(box.owner))
    connected, _ = await client.connect()
    assert connected
    frames: list[dict[str, Any]] = []

    async def read_until(done: Any) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while not done():
            left = deadline - asyncio.get_running_loop().time()
            assert left > 0, f"timed out; frames: {frames[-5:]}"
            # One wait for the next frame: a receive that times out ends the consumer.
            try:
                frames.append(await client.receive_json_from(timeout=left))
            except asyncio.TimeoutError:
                summary = [(f["type"], f["event"]["summary"] if f["type"] == "event" else
                            f["task"]["state"] if f["type"] == "task" else "") for f in frames]
                raise AssertionError(f"no frame in time; got {summary}") from None

    def state() -> str:
        return [f["task"]["state"] for f in frames if f["type"] == "task"][-1:][0] if any(f["type"] == "task" for f in frames) else ""

    await read_until(lambda: any(f["type"] == "event" and "before the question" in f["event"]["summary"] for f in frames)
                     and state() == "waiting")
    answered = await database_sync_to_async(box.api.post)(f"/api/tasks/{task_id}/continue", {"inputs": {"colour": "blue"}},
                                                          format="json")
    assert answered.status_code == 200, answered.json()
    await read_until(lambda: state() == "failed")
    await client.disconnect()

    def check_everything() -> None:
        view = box.task(task_id)
        assert view["error"] == "worker exited with 3: giving up with ${MY_API_KEY}"
        events = box.events(task_id)
        summaries = [e["summary"] for e in events]
        # The process did print its key after the question, and the tool its key: masked.
        assert "after the question (blue): ${MY_API_KEY}" in summaries
        assert "stepping with ${MY_API_KEY}" in summaries
        assert any("${TOOL_KEY}" in json.dumps(e) for e in events)
        bodies = {url: box.api.get(url).content.decode() for url in (
            f"/api/tasks/{task_id}", "/api/tasks", f"/api/tasks/{task_id}/report", f"/api/tasks/{task_id}/events?limit=1000")}
        for url, body in bodies.items():
            _hunt(f"GET {url}", body, needles)

        for event in TaskEvent.objects.filter(task_id=task_id):
            _hunt(f"event {event.seq}", event.summary + json.dumps(event.data) + json.dumps(event.artifacts), needles)
        for row in Question.objects.filter(task_id=task_id).values():
            _hunt("a question row", json.dumps(row, default=str), needles)
        for row in Run.objects.filter(task_id=task_id).values():
            _hunt("a run row", json.dumps(row, default=str), needles)
        for row in Task.objects.filter(pk=task_id).values():
            _hunt("the task row", json.dumps(row, default=str), needles)

    await database_sync_to_async(check_everything)()
    _hunt("a WebSocket frame", json.dumps(frames), needles)
    _hunt("the worker's log", worker_log.read_text(errors="replace"), needles)

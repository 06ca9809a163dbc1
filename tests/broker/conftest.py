"""Fixtures for broker tests: owner command tools that leave marks, and a real django-q2 cluster
for the tests where a live process waits on the owner (the API call must return meanwhile)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from tests.conftest import database_env, wait_for

ROOT = Path(__file__).resolve().parents[2]


class Marks:
    """A directory a fake paid tool writes into: a file per call proves the side effect happened."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o777)  # the tool runs as the box; the task may run as its own user

    def made(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.root.glob("call-*.json"))]


@pytest.fixture
def marks(tmp_path: Path) -> Marks:
    return Marks(tmp_path / "marks")


def tool_entry(name: str, marks: Marks, **extra: Any) -> dict[str, Any]:
    """A command tool that records its arguments in ``marks`` and answers ``{"done": true}``."""
    script = f'n=$(ls {marks.root} | wc -l); cat > {marks.root}/call-$n.json; echo \'{{"done": true}}\''
    return {"name": name, "command": ["/bin/sh", "-c", script], "schema": {"type": "object"}, **extra}


@pytest.fixture
def owner_tools(tmp_path: Path, settings: Any, marks: Marks) -> Iterator[Path]:
    """BOX_TOOLS_FILE with a free tool, a paid one (25¢) and an irreversible one."""
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([
        tool_entry("test.free", marks),
        tool_entry("test.paid", marks, cost_cents=25, description="costs a quarter"),
        tool_entry("test.launch", marks, irreversible=True),
    ]))
    settings.BOX_TOOLS_FILE = str(path)
    yield path


@pytest.fixture
def cluster(settings: Any, owner_tools: Path, transactional_db: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A real `manage.py qcluster` on the test database: runs execute in it, not in the test."""
    settings.BOX_RUN_INLINE = False
    env = database_env()
    env["BOX_TOOLS_FILE"] = str(owner_tools)
    env["BOX_RUN_INLINE"] = "0"
    env["BOX_WORKERS"] = "2"
    proc = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert django_settings.BOX_RUN_INLINE is False


def events_of(box: Any, task_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if kind is None or e["kind"] == kind]


def wait_event(box: Any, task_id: str, kind: str, timeout: float = 30.0) -> dict[str, Any]:
    return wait_for(lambda: next(iter(events_of(box, task_id, kind)), None), timeout=timeout,
                    what=f"a {kind} event on {task_id}")

"""Fixtures for broker tests: owner command tools that leave marks, and a real django-q2 cluster
for the tests where a live process waits on the owner (the API call must return meanwhile)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for


class Marks:
    """Where the fake tools write: a file per call proves the side effect happened."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def made(self, task_id: str) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / task_id).glob("call-*.json"))]


def tool_entry(name: str, root: Path, **extra: Any) -> dict[str, Any]:
    """A command tool that records its arguments under ``root/<task id>`` and answers ``{"done": true}``."""
    script = (f'd={root}/$BOX_TASK_ID; mkdir -p "$d"; n=$(ls "$d" | wc -l); cat > "$d/call-$n.json"; '
              'echo \'{"done": true}\'')
    return {"name": name, "command": ["/bin/sh", "-c", script], "schema": {"type": "object"}, **extra}


@pytest.fixture(scope="module")
def tools_file() -> Iterator[tuple[Path, Path]]:
    """BOX_TOOLS_FILE with a free tool, a paid one (25¢), an irreversible one and a broken one.

    In a private temporary directory rather than pytest's numbered ones, which a concurrent
    pytest session may rotate away while this module still needs them."""
    base = Path(tempfile.mkdtemp(prefix="box-owner-tools-"))
    os.chmod(base, 0o755)
    root = base / "marks"
    root.mkdir()
    os.chmod(root, 0o755)
    path = base / "tools.json"
    path.write_text(json.dumps([
        tool_entry("owner.free", root),
        tool_entry("owner.paid", root, cost_cents=25, description="costs a quarter"),
        tool_entry("owner.launch", root, irreversible=True),
        {"name": "owner.broken", "command": ["/bin/sh", "-c", "echo 'the shop is closed' >&2; exit 4"]},
    ]))
    yield path, root
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def owner_tools(tools_file: tuple[Path, Path], settings: Any) -> Path:
    settings.BOX_TOOLS_FILE = str(tools_file[0])
    return tools_file[0]


@pytest.fixture
def marks(tools_file: tuple[Path, Path], owner_tools: Path) -> Marks:
    return Marks(tools_file[1])


@pytest.fixture(scope="module")
def _module_cluster(django_db_setup: Any, django_db_blocker: Any, tools_file: tuple[Path, Path],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # One cluster per module: starting and stopping qcluster costs seconds, a test need not.

    with django_db_blocker.unblock():
        with running_box(tmp_path_factory.mktemp("cluster"), scheduler=False, BOX_TOOLS_FILE=str(tools_file[0]), BOX_WORKERS="2"):
            yield


@pytest.fixture
def cluster(_module_cluster: None, settings: Any, owner_tools: Path, transactional_db: Any) -> None:
    """A real `manage.py qcluster` on the test database: runs execute in it, not in the test,
    so the test can decide while a task's process waits on the owner."""
    queue_through_the_cluster(settings)


def events_of(box: Any, task_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if kind is None or e["kind"] == kind]


def wait_event(box: Any, task_id: str, kind: str, timeout: float = 30.0) -> dict[str, Any]:
    return wait_for(lambda: next(iter(events_of(box, task_id, kind)), None), timeout=timeout,
                    what=f"a {kind} event on {task_id}")

"""A data directory under a parent task users cannot traverse (0700), on both layer drivers.

Task processes reach their view and sockets by path. The sandbox builds each task's root with
the runtime path recreated inside it (tasks/sandbox/task_root.py), so the host's parents' modes do
not matter and such a data dir works: sandboxed steps, the broker socket and the ``box`` client
all work. Were that to regress, every step would fail with ``Permission denied``."""
from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from tasks.layers import disk
from tests.conftest import Box
from tests.sandbox.conftest import needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture(params=["overlay", "copy"])
def private_data_dir(request: Any, settings: Any) -> Iterator[Path]:
    """A data dir whose parent is 0700, outside /tmp (a task's /tmp is its own, so a parent
    there would prove nothing). Set up before the box, so it is removed after the box released
    its tasks and unmounted their views."""
    private = Path(django_settings.BOX_DATA_DIR).parent / f"owner-only-{secrets.token_hex(4)}"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    settings.BOX_DATA_DIR = private / "box-data"
    settings.BOX_DATA_DIR.mkdir()
    settings.BOX_LAYER_DRIVER = request.param
    yield settings.BOX_DATA_DIR
    disk.drop_spares()  # a task started late may have made more after the box's teardown
    mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(private) in line]
    assert not mounted, f"still mounted under {private}: {mounted}"
    shutil.rmtree(private)


def test_a_data_dir_under_a_private_parent_runs_sandboxed_steps(private_data_dir: Path, sandboxed: Box) -> None:
    task = sandboxed.create(title="private parent", flow={"steps": [
        {"run": "echo written > out.txt && cat out.txt && id -un", "save": "said"},
        {"tool": "notify.owner", "args": {"message": "reached the broker"}},
    ]}, tools=["notify.owner"])
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    records = sandboxed.api.get(f"/api/tasks/{task['id']}/report").json()["records"]
    assert records["said"] == f"written\nbox-{task['id']}"
    # A process of its own reaches the broker's socket (in the data dir) through the client.
    command = sandboxed.create(title="client", worker="command", prompt="p",
                               command=["/bin/sh", "-c", "box step reached-the-broker && pwd"])
    view = sandboxed.wait_state(command["id"], "done", "failed")
    assert view["state"] == "done", view["error"]
    assert any(e["summary"] == "reached-the-broker" for e in sandboxed.events(command["id"]))

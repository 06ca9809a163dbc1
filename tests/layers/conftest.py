"""Layer tests run twice: on the overlay driver (real overlayfs mounts, as root) and on the
copy driver. Each test gets its own data directory; a mount left behind fails the test."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.layers import disk, mounts, sealer
from tests.conftest import Box

DRIVERS = ["overlay", "copy"]


@pytest.fixture(params=DRIVERS)
def driver(request: Any, settings: Any, tmp_path: Path) -> Iterator[str]:
    if request.param == "overlay" and os.geteuid() != 0:
        pytest.skip("the overlay driver needs root")
    # short: the broker's Unix socket lives under the data dir (108-byte limit)
    data = Path(tempfile.mkdtemp(prefix="bl-", dir="/tmp"))
    settings.BOX_DATA_DIR = data
    settings.BOX_LAYER_DRIVER = request.param
    yield request.param
    disk.drop_spares()  # kept mounted while a box runs; its stop drops them
    leftover = mounts.mounts_under(data)
    mounts.unmount_all_under(data)
    shutil.rmtree(data, ignore_errors=True)
    assert not leftover, f"mounts left behind: {leftover}"


@pytest.fixture
def lbox(driver: str, box: Box) -> Box:
    """The box fixture, on the driver under test."""
    return box


def read(box: Box, path: str, workspace: str = "home") -> str | None:
    """The file's text in the workspace's current view, or None when it is not there."""
    response = box.api.get(f"/api/workspaces/{workspace}/files", {"path": path})
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["type"] == "file", body
    return body["content"]


def diff_of(box: Box, task_id: str) -> dict[str, Any]:
    response = box.api.get(f"/api/tasks/{task_id}/diff")
    assert response.status_code == 200, response.json()
    return response.json()


def undo(box: Box, task_id: str) -> dict[str, Any]:
    response = box.api.post(f"/api/tasks/{task_id}/undo")
    assert response.status_code == 200, response.json()
    return response.json()


def no_seal_beside_the_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """A done task's layer is left to whoever seals it next (the dependent's start, the task's
    release), as when the sealer had not got to it (``tasks.layers.sealer``)."""
    monkeypatch.setattr(sealer, "seal_beside", lambda *args: threading.Event())

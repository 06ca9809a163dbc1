"""Files a step carries (its full output, a browser step's screenshots and snapshots).

Stored under ``BOX_DATA_DIR/artifacts/<task>/<name>``, readable by the box alone (a task's user
must not read another task's output), listed on the event that produced them as
``{"name", "type", "size", "url"}``, served by ``GET /api/tasks/<id>/artifacts/<name>`` under
the task's own access rule, and removed with the task by retention.

An artifact's content passes the task's redaction function before it is written: the file on
disk never holds a secret the log would mask.
"""
from __future__ import annotations

import mimetypes
import os
import re
import shutil
from pathlib import Path
from typing import Any

from django.conf import settings

from boxsite.core.errors import NotFound
from tasks.vault.facts import Redactor

MAX_ARTIFACT_BYTES = 8 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
TRUNCATED_NOTE = "\n[the box kept the first {limit} bytes of this output; the rest was dropped]\n"


def artifacts_root() -> Path:
    return Path(settings.BOX_DATA_DIR) / "artifacts"


def artifact_dir(task_id: str) -> Path:
    if not task_id.isalnum():
        raise ValueError(f"not a task id: {task_id!r}")
    return artifacts_root() / task_id


def artifact_url(task_id: str, name: str) -> str:
    return f"/api/tasks/{task_id}/artifacts/{name}"


def content_type(name: str) -> str:
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


def save_text(task_id: str, name: str, text: str, redactor: Redactor) -> dict[str, Any]:
    """Write ``text`` (redacted, at most ``MAX_ARTIFACT_BYTES``) as artifact ``name``; return its listing."""
    if not _NAME.match(name):
        raise ValueError(f"not an artifact name: {name!r}")
    data = redactor.text(text).encode("utf-8", errors="replace")
    if len(data) > MAX_ARTIFACT_BYTES:
        data = data[:MAX_ARTIFACT_BYTES] + TRUNCATED_NOTE.format(limit=MAX_ARTIFACT_BYTES).encode()
    directory = artifact_dir(task_id)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(artifacts_root(), 0o700)
    target = directory / name
    partial = directory / f".{name}.partial"
    partial.write_bytes(data)
    partial.replace(target)  # a reader sees the whole file or none of it
    return {"name": name, "type": content_type(name), "size": len(data), "url": artifact_url(task_id, name)}


def save_bytes(task_id: str, name: str, data: bytes) -> dict[str, Any]:
    """Write ``data`` (an image the box already masked) as artifact ``name``; return its listing."""
    if not _NAME.match(name):
        raise ValueError(f"not an artifact name: {name!r}")
    directory = artifact_dir(task_id)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(artifacts_root(), 0o700)
    target = directory / name
    partial = directory / f".{name}.partial"
    partial.write_bytes(data[:MAX_ARTIFACT_BYTES])
    partial.replace(target)
    return {"name": name, "type": content_type(name), "size": min(len(data), MAX_ARTIFACT_BYTES),
            "url": artifact_url(task_id, name)}


def read_spool(path: Path) -> str:
    """The text a process wrote to a spool file (at most ``MAX_ARTIFACT_BYTES`` of it)."""
    with path.open("rb") as handle:
        data = handle.read(MAX_ARTIFACT_BYTES + 1)
    text = data[:MAX_ARTIFACT_BYTES].decode("utf-8", errors="replace")
    if len(data) > MAX_ARTIFACT_BYTES:
        text += TRUNCATED_NOTE.format(limit=MAX_ARTIFACT_BYTES)
    return text


def spool_dir(task_id: str) -> Path:
    """Where a run's raw output waits to become an artifact (the box's, never the task's)."""
    directory = artifact_dir(task_id) / ".spool"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(artifacts_root(), 0o700)
    return directory


def artifact_file(task_id: str, name: str) -> Path:
    """The file of artifact ``name``; ``NotFound`` for a name that is not one (or not there)."""
    if not _NAME.match(name):
        raise NotFound(f"no artifact '{name}'")
    path = artifact_dir(task_id) / name
    if not path.is_file():
        raise NotFound(f"no artifact '{name}'")
    return path


def remove_artifacts(task_id: str) -> None:
    shutil.rmtree(artifact_dir(task_id), ignore_errors=True)

"""Sandbox tests run for real: as root, with real users, namespaces, mounts and processes.

They skip (with the reason) where the box cannot sandbox; ``test_honesty`` covers that case.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tasks.layers import disk
from tasks.models import Task
from tasks.run import lifecycle
from tasks.sandbox import cleanup, users
from tasks.sandbox.support import missing_reason
from tasks.states import ACTIVE
from tests.conftest import Box


def sandbox_missing() -> str | None:
    return missing_reason()


needs_sandbox = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (real users and namespaces)")


@pytest.fixture
def sandboxed(box: Box, settings: Any, worker_id: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    """The ``box`` with the sandbox on and a pool of two spare task users; afterwards every user
    its tasks held is released (checked) and the pool is emptied.

    Each test worker is its own box (its own data directory): reconcile releases the users of
    tasks its database does not know, so two boxes must never share a data directory.
    """
    settings.BOX_SANDBOX = "auto"  # the data dir is already the worker's own (tests/conftest.py)
    settings.BOX_USER_POOL = 2  # task users are reused: every guarantee must hold across reuse
    # Subprocesses (a real qcluster) sign and check queued jobs with this process's key; in
    # another data directory they would otherwise generate their own.
    monkeypatch.setenv("DJANGO_SECRET_KEY", settings.SECRET_KEY)
    reason = sandbox_missing()
    if reason is not None:
        pytest.skip(f"no sandbox here: {reason}")
    yield box

    lifecycle.janitor.drain()  # releases still running in this process's background thread
    leftovers = []
    for task_id in Task.objects.values_list("pk", flat=True):
        if users.find_user(task_id) is not None:
            leftovers.append(task_id)
        cleanup.release(task_id)  # never leave a user behind, even when a test failed
    lifecycle.empty_spare_pool()  # nor a free one of the pool (nor one a killed worker was making)
    assert not leftovers or all(_was_active(t) for t in leftovers), f"users left behind by ended tasks: {leftovers}"


@contextmanager
def data_dir_where_a_box_keeps_it(settings: Any, name: str) -> Iterator[Path]:
    """A data directory of the test's own where a real box keeps it (not under /tmp, which the
    sandbox hides anyway). Afterwards its tasks are released, its pool emptied, the worker's data
    directory put back (so the ``sandboxed`` fixture's own clean-up makes nothing in this one),
    and the directory removed."""
    data = Path("/var/lib/box-sandbox-test") / f"{name}-{os.getpid()}"
    data.mkdir(parents=True, exist_ok=True)
    before, settings.BOX_DATA_DIR = settings.BOX_DATA_DIR, data
    try:
        yield data
    finally:
        lifecycle.janitor.drain()  # the releases of the test's tasks, then the pool of this data dir
        for task_id in Task.objects.values_list("pk", flat=True):
            lifecycle.release(task_id)
        lifecycle.empty_spare_pool()
        disk.drop_spares()
        settings.BOX_DATA_DIR = before
        subprocess.run(["rm", "-rf", str(data)], check=True)
        if not any(data.parent.iterdir()):
            data.parent.rmdir()


def _was_active(task_id: str) -> bool:
    return Task.objects.filter(pk=task_id, state__in=ACTIVE).exists()


def uid_of(task_id: str) -> int | None:
    """The uid of the user the task holds now (from the box's pool), or None."""
    ident = users.find_user(task_id)
    return None if ident is None else ident.uid


def outputs(box: Box, task_id: str) -> list[str]:
    """What the task's process printed (the command worker logs each stdout line)."""
    return [e["summary"] for e in box.events(task_id) if e["kind"] == "output"]


def results(box: Box, task_id: str) -> dict[str, str]:
    """``name=value`` lines a probe script printed, as a dict."""
    found = {}
    for line in outputs(box, task_id):
        if "=" in line:
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def run_script(box: Box, script: str, **spec: Any) -> dict[str, Any]:
    """Run ``script`` with the system python3 as a command task; wait until it ends."""
    task = box.create(title=spec.pop("title", "probe"), prompt="probe", worker="command",
                      command=["/usr/bin/python3", "-c", script], **spec)
    return box.wait_state(task["id"], "done", "failed", "cancelled")

"""Helpers for schedule and trigger tests: create through the API, move time by passing ``now``
to the scheduler's phases (never by sleeping)."""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.conftest import Box, database_env, queue_through_the_cluster


@pytest.fixture(autouse=True)
def _queued_only(settings: Any) -> None:
    # Fired tasks only need to exist here; running them is the worker's business.
    queue_through_the_cluster(settings)


def make_schedule(box: Box, **body: Any) -> dict[str, Any]:
    body.setdefault("template", {"title": "summarise the news", "prompt": "summarise"})
    response = box.api.post("/api/schedules", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def get_schedule(box: Box, schedule_id: int) -> dict[str, Any]:
    response = box.api.get(f"/api/schedules/{schedule_id}")
    assert response.status_code == 200, response.json()
    return response.json()


def tasks_from(box: Box, source: str) -> list[dict[str, Any]]:
    response = box.api.get("/api/tasks", {"source": source, "limit": 200})
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def run_scheduler_once(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The real scheduler process, one tick, against the test database."""
    env = database_env()
    env["BOX_QUEUE_NAME"] = str(settings.Q_CLUSTER["name"])
    result = subprocess.run(
        [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runscheduler", "--once"],
        env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result

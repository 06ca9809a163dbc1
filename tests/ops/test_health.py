"""/api/health says whether the worker and the scheduler are alive, from their heartbeats."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cluster import running_box, stop
from tests.conftest import Box, wait_for


def _health(box: Box) -> dict[str, Any]:
    response = box.api.get("/api/health")
    assert response.status_code == 200
    return response.json()


def test_without_a_worker_or_scheduler_health_says_never_seen(box: Box, tmp_path: Path, settings: Any) -> None:
    settings.BOX_DATA_DIR = tmp_path / "fresh"  # a data dir no process of the box has beaten in
    body = _health(box)
    assert body["worker"] == {"state": "never", "ok": False, "ageSeconds": None}
    assert body["scheduler"]["state"] == "never"


def test_health_shows_both_alive_then_the_stopped_one_stale(box: Box, tmp_path: Path, settings: Any) -> None:
    settings.BOX_BEAT_STALE_S = 3.0
    with running_box(tmp_path, BOX_BEAT_S="0.5") as procs:
        alive = wait_for(lambda: (h := _health(box))["worker"]["ok"] and h["scheduler"]["ok"] and h,
                         timeout=60, what="the worker and the scheduler to beat")
        assert alive["worker"]["state"] == "alive" and alive["worker"]["ageSeconds"] <= 3.0
        stop(procs["scheduler"])
        stale = wait_for(lambda: (h := _health(box))["scheduler"]["state"] == "stale" and h,
                         timeout=30, what="the stopped scheduler to go stale")
        assert stale["scheduler"]["ok"] is False and stale["scheduler"]["ageSeconds"] > 3.0
        assert stale["worker"]["state"] == "alive"

"""What a worker process carries: no web-only modules, and a fresh process after BOX_WORKER_RECYCLE runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings

from tasks.layers import paths
from tasks.models import Run
from tests.cluster import running_box
from tests.conftest import Box, database_env, queue_through_the_cluster, wait_for
from tests.factories import flow

# What the cluster leader has imported when it forks its workers (they inherit all of it).
LEADER_AT_FORK = """
import json, sys
import django
django.setup()
from boxsite.management.commands import runcluster

def at_fork(on_stop):
    print(json.dumps(sorted(sys.modules)))
    raise SystemExit(0)

runcluster.start_cluster = at_fork
runcluster.Command().run_from_argv(["manage.py", "runcluster"])
"""

# Modules only the web process or a rare kind of step needs, each tens of MB in every worker.
NOT_IN_A_WORKER = ("twisted", "daphne", "openai", "playwright", "boxsite.urls", "tasks.api.views", "drf_spectacular.openapi")


def test_a_worker_is_forked_without_web_only_modules() -> None:
    out = subprocess.run([sys.executable, "-c", LEADER_AT_FORK], env=database_env(), cwd=settings.BASE_DIR,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    modules = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "tasks.jobs" in modules  # what the workers run is loaded before the fork, once
    loaded = sorted(m for m in modules if m.split(".")[0] in NOT_IN_A_WORKER or m in NOT_IN_A_WORKER)
    assert not loaded, f"the workers would carry: {loaded[:20]}"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_worker_is_replaced_after_box_worker_recycle_runs(box: Box, tmp_path: Path, settings: Any) -> None:
    queue_through_the_cluster(settings)
    with running_box(tmp_path, scheduler=False, BOX_WORKERS="1", BOX_WORKER_RECYCLE="2"):
        ids = []
        for i in range(3):
            task = box.create(title=f"trivial {i}", flow=flow({"write": {"path": "out.txt", "content": str(i)}}))
            box.wait_state(task["id"], "done", timeout=60)
            ids.append(task["id"])
        first, second, third = (Run.objects.get(task_id=t).worker_pid for t in ids)
        assert first == second != third  # one worker ran two runs; a fresh one the third
        assert _comm(third) == "box-worker"
        wait_for(lambda: not Path(f"/proc/{first}").exists(), timeout=30, what="the recycled worker to exit")
        # It finished the releases in hand before it went: the second task's view is gone.
        assert not (paths.views_root() / ids[1]).exists()

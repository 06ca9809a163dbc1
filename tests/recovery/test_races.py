"""Cancel racing a worker's claim and first writes: never a deadlock, a 500, or an ignored cancel."""
from __future__ import annotations

import pytest

from tasks.models import Run, Task
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow

pytestmark = pytest.mark.usefixtures("cluster_mode")

PAIRS = 150
STEPS = flow({"write": {"path": "a.txt", "content": "a"}}, {"run": "cat a.txt"}, {"run": "sleep 0.2"})


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)


def test_create_then_cancel_at_once_hundreds_of_times_every_cancel_holds(box, tmp_path):
    statuses: list[int] = []
    task_ids: list[str] = []
    with running_box(tmp_path, BOX_WORKERS="2"):
        for _ in range(PAIRS):
            task_ids.append(box.create(title="race", flow=STEPS)["id"])
            # Right away: the cluster is claiming the run, moving the task to running, writing its first steps.
            statuses.append(box.api.post(f"/api/tasks/{task_ids[-1]}/cancel").status_code)
        wait_for(lambda: not Run.objects.filter(task_id__in=task_ids, state__in=["queued", "running"]).exists(),
                 timeout=120, what="every run to close")
    assert statuses == [200] * PAIRS, {code: statuses.count(code) for code in set(statuses)}
    states = list(Task.objects.filter(pk__in=task_ids).values_list("state", flat=True))
    assert states == ["cancelled"] * PAIRS, {s: states.count(s) for s in set(states)}
    failed_runs = Run.objects.filter(task_id__in=task_ids).exclude(error="").exclude(outcome="cancelled")
    assert not [r.error for r in failed_runs if "deadlock" in r.error]

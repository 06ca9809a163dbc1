"""Every pause and every way out of it, end to end on a real django-q2 cluster (a subprocess
sharing the test database): runs execute there, the test only uses the API."""
from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.pauses.helpers import cont, open_questions, pending_approval, post, report

pytestmark = pytest.mark.usefixtures("cluster")


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pause-cluster")


@pytest.fixture(scope="module")
def _module_cluster(django_db_setup: Any, django_db_blocker: Any, cluster_dir: Path) -> Iterator[None]:
    # One cluster for the module: starting qcluster costs seconds, a test need not.

    with django_db_blocker.unblock():
        with running_box(cluster_dir, scheduler=False, BOX_WORKERS="2"):
            yield


@pytest.fixture
def cluster(_module_cluster: None, settings: Any, transactional_db: Any) -> None:
    queue_through_the_cluster(settings)


def waiting(box: Any, task_id: str, kind: str) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        view = box.task(task_id)
        return view if view["final"] or (view["state"] == "waiting" and view["waitingFor"] == kind) else None

    view = wait_for(settled, timeout=60, what=f"{task_id} to wait for {kind}")
    assert view["state"] == "waiting" and view["waitingFor"] == kind, (view["state"], view["waitingFor"], view["error"])
    return view


def finished(box: Any, task_id: str, state: str = "done") -> dict[str, Any]:
    view = box.wait_state(task_id, "done", "failed", "cancelled", timeout=60)
    assert view["state"] == state, (view["state"], view["error"])
    return view


def test_input_then_continue_runs_to_done(box):
    task = box.create(title="needs", flow=flow({"run": "echo hello ${name}", "save": "said"}))
    waiting(box, task["id"], "input")
    assert cont(box, task["id"], inputs={"name": "Asha"}).status_code == 200
    finished(box, task["id"])
    assert report(box, task["id"])["records"]["said"] == "hello Asha"


def test_approval_then_approve_runs_the_guarded_step_once_and_the_rest_anew(box):
    spec = flow({"run": "echo a >> log.txt"}, {"run": "echo b >> log.txt", "stop_before": "b acts"},
                {"run": "echo c >> log.txt"}, {"run": "cat log.txt", "save": "log"})
    task = box.create(title="guarded", flow=spec)
    waiting(box, task["id"], "approval")
    approval = pending_approval(box, task["id"])
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200
    assert post(box, f"/api/approvals/{approval['id']}/approve").status_code == 200  # twice: one resume
    finished(box, task["id"])
    body = report(box, task["id"])
    assert body["records"]["log"] == "a\nb\nc"
    assert [r["outcome"] for r in body["runs"]] == ["waiting:approval", "continued", "done"]


def test_approval_then_deny_cancels(box):
    task = box.create(title="guarded", flow=flow({"run": "true", "stop_before": "really?"}))
    waiting(box, task["id"], "approval")
    assert cont(box, task["id"], approve=False).status_code == 200
    finished(box, task["id"], "cancelled")


def test_checkpoint_then_approve_goes_on(box):
    task = box.create(title="cp", flow=flow({"checkpoint": "look first"}, {"run": "echo on", "save": "on"}))
    waiting(box, task["id"], "checkpoint")
    assert cont(box, task["id"], approve=True).status_code == 200
    finished(box, task["id"])


def test_payment_checkpoint_is_released_only_by_cancel_or_undo(box):
    task = box.create(title="buy", flow=flow({"checkpoint": {"reason": "pay", "payment": True}}, {"run": "true"}))
    view = waiting(box, task["id"], "checkpoint")
    assert view["final"] is True and view["next"] == ["cancel", "undo", "diff", "report"]
    assert cont(box, task["id"], approve=True).status_code == 409
    assert post(box, f"/api/tasks/{task['id']}/cancel").status_code == 200
    finished(box, task["id"], "cancelled")


def test_a_human_wall_then_continue_re_runs_that_step(box):
    wall = "if [ -f tried ]; then echo through; else touch tried; echo 'please complete the captcha'; exit 1; fi"
    task = box.create(title="wall", flow=flow({"run": wall, "save": "wall"}))
    waiting(box, task["id"], "human")
    assert [q["kind"] for q in open_questions(box, task["id"])] == ["human"]
    assert cont(box, task["id"], answer="done").status_code == 200
    finished(box, task["id"])
    assert report(box, task["id"])["records"]["wall"] == "through"


def test_a_plain_language_task_without_a_planner_waits_for_a_plan(box):
    task = box.create(title="plan", prompt="tidy up my downloads")
    view = waiting(box, task["id"], "plan")
    assert view["next"][0] != "continue"
    assert cont(box, task["id"], answer="go").status_code == 409


def test_a_two_blocker_pause_and_limits_across_runs(box):
    spec = flow({"run": "echo ${city}"}, {"run": "true", "stop_before": "one"}, {"run": "true"})
    task = box.create(title="limited", flow=spec, limits={"max_actions": 2})
    waiting(box, task["id"], "input")
    assert cont(box, task["id"], inputs={"city": "Pune"}).status_code == 200
    waiting(box, task["id"], "approval")
    assert cont(box, task["id"], approve=True).status_code == 200
    view = finished(box, task["id"], "failed")
    assert "max_actions" in view["error"] and view["recoverable"] is True and view["spent"]["actions"] == 2


def test_no_secret_reaches_the_worker_log(box, cluster_dir):
    password = f"pw-{secrets.token_hex(8)}"
    card = "4111111111111111"
    spec = flow({"run": "echo ${password} " + card, "save": "said"},
                {"run": "echo 'failing with ${password}' >&2; exit 5"})
    task = box.create(title="canary", flow=spec, facts={"password": password})
    finished(box, task["id"], "failed")
    log = (cluster_dir / "qcluster.log").read_text()
    assert task["id"] in log or "run" in log  # the worker did log something
    assert password not in log and card not in log
    for body in (box.api.get(f"/api/tasks/{task['id']}").content, box.api.get(f"/api/tasks/{task['id']}/report").content,
                 box.api.get(f"/api/tasks/{task['id']}/events").content):
        assert password.encode() not in body and card.encode() not in body

"""An abandoned action lease: a worker SIGKILLed between attempting a consequential request and
recording its receipt. The next run finds the action executing under a run that is gone: it
becomes unknown and is never sent again by itself; the owner's word lets the task go on."""
from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from approvals.models import Action
from tasks.models import Run
from tests.cluster import running_box
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.http_server import Handler, serving
from tests.pauses.helpers import open_questions, post

pytestmark = pytest.mark.usefixtures("cluster_mode")


@pytest.fixture
def cluster_mode(settings):
    queue_through_the_cluster(settings)
    settings.BOX_MAX_RUN_ATTEMPTS = 3


class SlowShop(Handler):
    """Takes the order, then holds the answer until the test lets go: the worker is mid-call."""

    calls: list[str]
    release: threading.Event

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        type(self).calls.append(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        type(self).release.wait(60)
        try:
            self.reply(201, b'{"order": 1}')
        except OSError:
            pass  # the worker that asked is dead


def _mid_call(task_id: str, shop: Any) -> Run | None:
    run = Run.objects.filter(task_id=task_id, number=1, state="running").exclude(worker_pid=None).first()
    return run if run is not None and shop.calls else None


def test_a_worker_killed_mid_call_leaves_the_action_unknown_and_it_is_never_sent_again(box, tmp_path):
    shop = type("SlowShopForTest", (SlowShop,), {"calls": [], "release": threading.Event()})
    with serving(shop) as port, running_box(tmp_path):
        try:
            spec = flow({"http": {"url": f"http://127.0.0.1:{port}/orders", "method": "POST", "body": {"item": "lamp"}},
                         "stop_before": "places a real order"}, {"run": "echo after"})
            task = box.create(title="order once", hosts=["127.0.0.1"], flow=spec, constraints={"allow_destructive": True})
            run = wait_for(lambda: _mid_call(task["id"], shop), timeout=60, what="the worker to be mid-call")
            assert Action.objects.get(task_id=task["id"]).state == "executing"
            os.kill(run.worker_pid, signal.SIGKILL)

            view = box.wait_state(task["id"], "waiting", "failed", "done", timeout=90)
            assert (view["state"], view["waitingFor"]) == ("waiting", "human"), view
            (question,) = open_questions(box, task["id"])
            assert question["kind"] == "action"
            (action,) = box.api.get(f"/api/tasks/{task['id']}/actions").json()["results"]
            assert action["state"] == "unknown" and action["receipt"] is None and action["run"] == 1
            assert len(shop.calls) == 1

            response = post(box, f"/api/questions/{question['id']}/answer", {"answer": "happened"})
            assert response.status_code == 200, response.json()
            done = box.wait_state(task["id"], "done", "failed", timeout=90)
        finally:
            shop.release.set()
    assert done["state"] == "done", done
    assert len(shop.calls) == 1  # sent once, across the killed run, the retry and the resume
    assert Action.objects.get(task_id=task["id"]).state == "succeeded"
    runs = list(Run.objects.filter(task_id=task["id"]).order_by("number").values_list("state", flat=True))
    assert runs[0] == "lost" and len(runs) == 3, runs


def _order_task(box: Any, port: int) -> dict[str, Any]:
    spec = flow({"http": {"url": f"http://127.0.0.1:{port}/orders", "method": "POST", "body": {"item": "lamp"}},
                 "stop_before": "places a real order"}, {"run": "echo after"})
    return box.create(title="order once", hosts=["127.0.0.1"], flow=spec, constraints={"allow_destructive": True})


def test_a_task_cancelled_mid_call_closes_its_action_as_unknown(box, tmp_path):
    shop = type("SlowShopForTest", (SlowShop,), {"calls": [], "release": threading.Event()})
    with serving(shop) as port, running_box(tmp_path):
        try:
            task = _order_task(box, port)
            wait_for(lambda: _mid_call(task["id"], shop), timeout=60, what="the worker to be mid-call")
            response = box.api.post(f"/api/tasks/{task['id']}/cancel")
            assert response.status_code == 200, response.json()
            (action,) = box.api.get(f"/api/tasks/{task['id']}/actions").json()["results"]
        finally:
            shop.release.set()
    assert action["state"] == "unknown" and action["receipt"] is None, action
    notes = [e["summary"] for e in box.events(task["id"]) if e["kind"] == "note" and e["data"].get("action")]
    assert len(notes) == 1 and "the task ended while the call was in flight" in notes[0], notes


def test_a_run_lost_mid_call_with_no_attempt_left_closes_its_action_as_unknown(box, tmp_path, settings):
    settings.BOX_MAX_RUN_ATTEMPTS = 1
    shop = type("SlowShopForTest", (SlowShop,), {"calls": [], "release": threading.Event()})
    with serving(shop) as port, running_box(tmp_path, BOX_MAX_RUN_ATTEMPTS="1"):
        try:
            task = _order_task(box, port)
            run = wait_for(lambda: _mid_call(task["id"], shop), timeout=60, what="the worker to be mid-call")
            os.kill(run.worker_pid, signal.SIGKILL)
            view = box.wait_state(task["id"], "failed", "done", timeout=90)
        finally:
            shop.release.set()
    assert view["state"] == "failed", view
    (action,) = box.api.get(f"/api/tasks/{task['id']}/actions").json()["results"]
    assert action["state"] == "unknown" and action["receipt"] is None, action
    assert len(shop.calls) == 1

"""Sending runs to the queue (``tasks.run.leases.send``): every run sent arrives as its job, and on Redis
the process's sends share one connection instead of making one each
(docs/internals/decisions-performance.md#performance)."""
from __future__ import annotations

import multiprocessing
import sys
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django_q.brokers import get_broker
from django_q.signing import SignedPackage

from tasks.models import Run
from tasks.run import leases as runs
from tests.conftest import Box, queue_through_the_cluster
from tests.factories import flow

TRIVIAL = flow({"write": {"path": "out.txt", "content": "x"}})


def _jobs() -> list[dict[str, Any]]:
    broker, jobs = get_broker(), []
    while broker.queue_size():
        for ack_id, payload in broker.dequeue() or []:
            jobs.append(SignedPackage.loads(payload))
            broker.acknowledge(ack_id)
    return jobs


def test_each_task_created_sends_its_run_as_one_job(box: Box, settings: Any) -> None:
    queue_through_the_cluster(settings)
    get_broker().purge_queue()
    created = [box.create(title=f"t{i}", flow=TRIVIAL)["id"] for i in range(3)]
    sent = [Run.objects.get(task_id=task_id).pk for task_id in created]
    jobs = _jobs()
    assert [(job["func"], job["args"], job["name"]) for job in jobs] == [
        ("tasks.jobs.execute_run", (run_id,), f"run-{run_id}") for run_id in sent]


@pytest.mark.skipif(not django_settings.REDIS_URL, reason="the queue is on Redis")
def test_a_process_sends_its_runs_on_one_redis_connection(box: Box, settings: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    queue_through_the_cluster(settings)
    get_broker().purge_queue()
    box.create(title="first", flow=TRIVIAL)  # the process's broker and its connection exist from here on
    connects: list[object] = []
    real_connect = redis.connection.Connection._connect  # a socket made, not a command's check

    def counted_connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        connects.append(self)
        return real_connect(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted_connect)
    for i in range(5):
        box.create(title=f"t{i}", flow=TRIVIAL)
    runs.send(Run.objects.order_by("pk").last().pk)  # sent again, as the scheduler does
    assert connects == []
    assert len(_jobs()) == 7



def _send_from_child(parent_broker_id: int) -> None:
    sys.exit(0 if id(runs._broker()) != parent_broker_id else 1)


def test_a_forked_child_makes_its_own_broker_even_when_the_parent_held_the_lock_at_the_fork(db: None) -> None:
    parent = runs._broker()
    child = multiprocessing.get_context("fork").Process(target=_send_from_child, args=(id(parent),))
    with runs._kept_lock:  # a thread of the parent busy in ``_broker`` at the fork
        child.start()
    child.join(timeout=60)
    if child.exitcode is None:
        child.kill()
        child.join()
        pytest.fail("the forked child waited for the parent's lock")
    assert child.exitcode == 0, "the child reused its parent's broker"

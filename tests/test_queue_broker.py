"""The embedded queue's broker (tasks.run.queue.WakingORM)."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import OrmQ

from tasks.run.queue import WakingORM


@pytest.mark.django_db(transaction=True)
def test_enqueue_keeps_the_callers_connection():
    """A POST enqueues its run after its commit: the request's connection must outlive it, even
    past its age (django-q2's own enqueue closed it, and the request's next query reconnected)."""
    broker = WakingORM(list_key="test-keeps-connection")
    connection.ensure_connection()
    before = connection.connection
    connection.close_at = time.monotonic() - 1  # past CONN_MAX_AGE: an "old" connection

    job_id = broker.enqueue("payload")

    assert connection.connection is before
    job = OrmQ.objects.get(pk=job_id)
    assert (job.key, job.payload) == ("test-keeps-connection", "payload")


@pytest.mark.django_db(transaction=True)
def test_a_job_is_taken_once_until_its_lock_runs_out_and_gone_once_acknowledged():
    broker = WakingORM(list_key="test-takes-once")
    other = WakingORM(list_key="test-another-queue")
    first, second = broker.enqueue("one"), broker.enqueue("two")
    other.enqueue("not ours")

    taken = [job for _ in range(2) for job in broker.dequeue() or []]  # django-q2 takes Conf.BULK (1) at a time

    assert sorted(taken) == [(first, "one"), (second, "two")]
    locked = OrmQ.objects.get(pk=first).lock
    assert locked > timezone.now() + timedelta(seconds=Conf.RETRY - 60)
    assert broker.dequeue() is None  # both locked: nobody else takes them meanwhile
    OrmQ.objects.filter(pk=second).update(lock=timezone.now() - timedelta(seconds=1))  # its taker died
    assert broker.dequeue() == [(second, "two")]
    broker.acknowledge(first)
    assert sorted(OrmQ.objects.values_list("payload", flat=True)) == ["not ours", "two"]

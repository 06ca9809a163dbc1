"""The embedded queue's broker (tasks.queue_broker.WakingORM)."""
from __future__ import annotations

import time

import pytest
from django.db import connection
from django_q.models import OrmQ

from tasks.queue_broker import WakingORM


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

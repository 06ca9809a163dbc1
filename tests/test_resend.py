"""Which queued runs the scheduler sends again (``runs.stranded_runs``): those the queue seems to
have lost, not those waiting their turn behind a busy queue."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from tasks.models import Run
from tasks.run import leases as runs
from tests.conftest import Box, queue_through_the_cluster
from tests.factories import flow


def sent_runs(box: Box, settings: Any, *ages_s: float) -> tuple[datetime, list[Run]]:
    """One queued run per age, written as sent that many seconds before the returned now."""
    queue_through_the_cluster(settings)
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 4}
    settings.BOX_RESEND_S = 5
    now = timezone.now()
    sent = []
    for n, age in enumerate(ages_s):
        task = box.create(title=f"sent {n}", flow=flow({"write": {"path": "a.txt", "content": "a"}}))
        run = Run.objects.get(task_id=task["id"])
        Run.objects.filter(pk=run.pk).update(enqueued_at=now - timedelta(seconds=age))
        sent.append(run)
    return now, sent


def claimed(run: Run, now: datetime, ago_s: float) -> None:
    assert runs.claim(run.pk) is not None
    Run.objects.filter(pk=run.pk).update(started_at=now - timedelta(seconds=ago_s))


def test_a_run_sent_long_ago_while_nothing_was_claimed_is_sent_again(box: Box, settings: Any) -> None:
    now, (earlier, lost) = sent_runs(box, settings, 12, 10)
    claimed(earlier, now, 7)  # before the last BOX_RESEND_S
    assert runs.stranded_runs(now) == [lost.pk]


def test_a_run_overtaken_by_the_claim_of_a_run_sent_after_it_is_sent_again(box: Box, settings: Any) -> None:
    now, (lost, later) = sent_runs(box, settings, 10, 8)
    claimed(later, now, 3)
    assert runs.stranded_runs(now) == [lost.pk]


def test_a_run_waiting_its_turn_behind_the_claims_of_earlier_runs_is_not_sent_again(box: Box, settings: Any) -> None:
    now, (earlier, waiting, recent) = sent_runs(box, settings, 10, 8, 1)
    claimed(earlier, now, 3)
    assert runs.stranded_runs(now) == []
    assert sorted(runs.stranded_runs(now + timedelta(seconds=6))) == [waiting.pk, recent.pk]  # then nothing claimed for 5 s


def test_no_run_is_sent_again_while_no_worker_is_free(box: Box, settings: Any) -> None:
    now, (lost, later) = sent_runs(box, settings, 10, 8)
    claimed(later, now, 20)
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "workers": 1}
    assert runs.stranded_runs(now) == []

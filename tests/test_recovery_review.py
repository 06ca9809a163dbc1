"""A failed required edge between separate roots: one version-bound recovery review instead of a
failure; its end (done, failed or cancelled) lets the dependent decide afresh."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tasks import services
from tasks.models import Dependency, Task
from tests.conftest import Box
from tests.factories import flow
from tests.test_dependencies import approve, held, runs_of

FAILS = [{"delete": {"path": "missing.txt"}}]  # approving it runs a delete of a missing file: it fails


def failed_upstream_and_waiting_dependent(box: Box, **dependent: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    upstream = held(box, title="make the report", after=FAILS)
    waiting = box.create(title="send the report", flow=flow({"write": {"path": "s.txt", "content": "s"}}),
                         dependsOn=[upstream["id"]], **dependent)
    approve(box, upstream["id"])
    box.wait_state(upstream["id"], "failed")
    return upstream, waiting


def review_of(task_id: str) -> Task:
    return Task.objects.get(pk=Dependency.objects.get(task_id=task_id, recovers__isnull=False).on_id)


@pytest.mark.parametrize("how", ["continue", "cancel", "fail"])
def test_a_failed_edge_between_roots_opens_one_review_whose_end_releases_the_dependent(box: Box, how: str) -> None:
    upstream, dependent = failed_upstream_and_waiting_dependent(box)
    view = box.task(dependent["id"])
    assert view["state"] == "queued" and runs_of(dependent["id"]) == []  # not failed: it waits for the review
    review = review_of(dependent["id"])
    assert review.source == f"recovery:{dependent['id']}" and review.title == "Review: make the report"
    assert f"Task {dependent['id']} (send the report) needed task {upstream['id']} to succeed" in review.prompt
    edges = {e["task"]: e for e in box.api.get(f"/api/tasks/{dependent['id']}/dependencies").json()["dependencies"]}
    assert (edges[upstream["id"]]["required"], edges[upstream["id"]]["edge"]) == (False, "unsatisfied")  # history
    assert (edges[review.pk]["condition"], edges[review.pk]["required"]) == ("completion", True)
    edge = Dependency.objects.get(task_id=dependent["id"], on_id=review.pk)
    assert edge.recovers.on_id == upstream["id"] and edge.recovers_version == box.task(upstream["id"])["version"]
    note = [e for e in box.events(dependent["id"]) if e["kind"] == "note" and "recovery" in e["data"]]
    assert note[0]["data"]["recovery"]["review"] == review.pk

    box.wait_state(review.pk, "waiting")  # it waits for the owner at its checkpoint
    if how == "continue":
        approve(box, review.pk)
        box.wait_state(review.pk, "done")
    elif how == "cancel":
        assert box.api.post(f"/api/tasks/{review.pk}/cancel").status_code == 200
    else:
        assert box.api.post(f"/api/tasks/{review.pk}/continue", {"approve": False}, format="json").status_code == 200
        box.wait_state(review.pk, "failed", "cancelled")
    box.wait_state(dependent["id"], "done")  # the fresh decision: it starts, without the failed dependency
    assert Task.objects.filter(source__startswith="recovery:").count() == 1  # never a review of the review


def test_a_review_is_created_once_however_often_the_sweep_runs(box: Box) -> None:
    _, dependent = failed_upstream_and_waiting_dependent(box)
    assert services.release_waiting() == 0 and services.release_if_ready(dependent["id"]) is False
    services.wake_dependents(review_of(dependent["id"]).pk)
    assert Task.objects.filter(source=f"recovery:{dependent['id']}").count() == 1


def test_within_one_root_the_dependent_fails_with_the_reason(box: Box) -> None:
    root = held(box, title="one root")
    upstream = held(box, title="inner", after=FAILS, parent=root["id"])
    dependent = box.create(title="sibling", flow=flow({"write": {"path": "s.txt", "content": "s"}}),
                           dependsOn=[upstream["id"]], parent=root["id"])
    approve(box, upstream["id"])
    failed = box.wait_state(dependent["id"], "failed")
    assert failed["error"] == f"cannot start: dependency {upstream['id']} ended failed; this task needed it to succeed"
    assert not Task.objects.filter(source__startswith="recovery:").exists()


def test_a_cancelled_dependency_fails_the_dependent_without_a_review(box: Box) -> None:
    upstream = held(box, title="cancelled")
    dependent = box.create(title="after", flow=flow({"write": {"path": "a.txt", "content": "a"}}), dependsOn=[upstream["id"]])
    assert box.api.post(f"/api/tasks/{upstream['id']}/cancel").status_code == 200
    assert "ended cancelled" in box.wait_state(dependent["id"], "failed")["error"]
    assert not Task.objects.filter(source__startswith="recovery:").exists()


@pytest.mark.skipif(not settings.DB_IS_POSTGRES, reason="concurrent transactions need PostgreSQL")
def test_concurrent_sweeps_create_one_review(box: Box, monkeypatch: Any) -> None:
    for _ in range(3):
        monkeypatch.setattr(services, "wake_dependents", lambda task_id, **kw: None)  # only the sweeps decide
        _, dependent = failed_upstream_and_waiting_dependent(box)
        monkeypatch.undo()
        assert box.task(dependent["id"])["state"] == "queued"
        barrier = threading.Barrier(3)
        moved: list[bool] = []

        def sweep() -> None:
            try:
                barrier.wait()
                moved.append(services.release_if_ready(dependent["id"]))
            finally:
                connection.close()

        threads = [threading.Thread(target=sweep) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(moved) == [False, False, True]
        assert Task.objects.filter(source=f"recovery:{dependent['id']}").count() == 1
        assert Dependency.objects.filter(task_id=dependent["id"], recovers__isnull=False).count() == 1

"""A done task's layer is sealed beside its finish (``tasks.layers.sealer``), off the path of a
task chained after it: by the worker's sealer thread, while the finish's transaction runs, under
the run's lease. A finish that does not end the task leaves the layer sealed on disk only, and
the task's next run reopens it with everything its runs wrote."""
from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tasks import jobs, layers
from tasks.layers import paths, task_view
from tasks.layers.tree import Meta
from tasks.models import Layer, Run, Task
from tasks.run import leases as runs
from tasks.run import lifecycle, reaper, worker
from tests.conftest import queue_through_the_cluster, wait_for
from tests.factories import flow
from tests.layers.conftest import read


def sealed_on_disk(task_id: str) -> bool:
    return Meta.load(paths.layer_dir(task_id)).sealed


def sealing_threads(monkeypatch: pytest.MonkeyPatch, *, finish_waits: bool = False) -> list[str]:
    """The names of the threads that seal layers' files from now on. ``finish_waits``: each
    finish first waits (up to 10 s) until the sealer has begun sealing: a sealer that comes late
    (its thread not yet scheduled when the finish is over) leaves the seal as before."""
    names: list[str] = []
    begun = threading.Semaphore(0)
    seal_files, finish_run = task_view.seal_files, worker.finish_run

    def recorded(*args: Any, **kwargs: Any) -> Any:
        names.append(threading.current_thread().name)
        if names[-1] == "box-sealer":
            begun.release()
        return seal_files(*args, **kwargs)

    def finishing(*args: Any, **kwargs: Any) -> Any:
        begun.acquire(timeout=10)
        return finish_run(*args, **kwargs)

    monkeypatch.setattr(task_view, "seal_files", recorded)
    if finish_waits:
        monkeypatch.setattr(worker, "finish_run", finishing)
    return names


def overlay_only(driver: str) -> None:
    if driver != "overlay":
        pytest.skip("only overlay layers are sealed beside their finish")


def no_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """The janitor seals nothing (its release of the layers does nothing)."""
    monkeypatch.setattr(layers, "release", lambda *args, **kwargs: None)


def test_a_done_tasks_layer_is_sealed_beside_its_finish(lbox, driver, monkeypatch):
    no_release(monkeypatch)
    threads = sealing_threads(monkeypatch, finish_waits=driver == "overlay")
    task = lbox.create(title="writes", flow=flow({"write": {"path": "a.txt", "content": "A\n"}}))
    assert lbox.wait_state(task["id"], "done")["state"] == "done"
    if driver == "overlay":
        wait_for(lambda: sealed_on_disk(task["id"]), what="the layer sealed without its release")
        assert threads == ["box-sealer"]
        layer = Layer.objects.get(task_id=task["id"])
        assert layer.sealed and layer.manifest["paths"] == [{"path": "a.txt", "kind": "added"}] and not layer.note_due
    else:  # the copy driver's seal is left whole to the dependent's start or the release
        assert lifecycle.janitor.drain() and threads == [] and not sealed_on_disk(task["id"])
    dependent = lbox.create(title="reads", dependsOn=[task["id"]], flow=flow({"run": "cat a.txt > b.txt"}))
    assert lbox.wait_state(dependent["id"], "done")["state"] == "done"
    assert lifecycle.janitor.drain()
    # the dependent's start sealed nothing on overlay; on copy, the layer it stacked
    assert threads == (["box-sealer", "box-sealer"] if driver == "overlay" else ["MainThread"])
    assert lifecycle.release(task["id"]) and lifecycle.release(dependent["id"])
    assert read(lbox, "b.txt") == "A\n"


def test_a_failed_or_waiting_task_is_not_sealed_beside_its_finish(lbox, monkeypatch):
    no_release(monkeypatch)
    threads = sealing_threads(monkeypatch)
    failed = lbox.create(title="fails", flow=flow({"write": {"path": "a.txt", "content": "A\n"}}, {"run": "exit 3"}))
    assert lbox.wait_state(failed["id"], "failed")["state"] == "failed"
    waiting = lbox.create(title="waits", flow=flow({"write": {"path": "w.txt", "content": "W\n"}}, {"checkpoint": "look"}))
    assert lbox.wait_state(waiting["id"], "waiting")["state"] == "waiting"
    assert lifecycle.janitor.drain()
    assert threads == [] and not sealed_on_disk(failed["id"]) and not sealed_on_disk(waiting["id"])
    monkeypatch.undo()
    assert lifecycle.release(failed["id"]) and sealed_on_disk(failed["id"])


def _executed(settings: Any, lbox: Any, before_finish: Callable[[Run], None]) -> str:
    """A trivial task's run executed here, ``before_finish`` called with its run as its finish
    begins: the task's id."""
    queue_through_the_cluster(settings)
    task = lbox.create(title="finishing", flow=flow({"write": {"path": "a.txt", "content": "A\n"}}))
    run = Run.objects.get(task_id=task["id"])
    finish_run = worker.finish_run

    def finishing(*args: Any, **kwargs: Any) -> Any:
        before_finish(Run.objects.get(pk=run.pk))
        return finish_run(*args, **kwargs)

    jobs_finish = pytest.MonkeyPatch()
    jobs_finish.setattr(worker, "finish_run", finishing)
    try:
        jobs.execute_run(run.pk)
    finally:
        jobs_finish.undo()
    return str(task["id"])


def test_a_finish_that_loses_its_lease_leaves_the_layer_sealed_on_disk_and_the_next_run_reopens_it(
        lbox, driver, settings, monkeypatch):
    overlay_only(driver)
    no_release(monkeypatch)
    begun = threading.Event()
    seal_files = task_view.seal_files

    def sealing(*args: Any, **kwargs: Any) -> Any:
        begun.set()
        return seal_files(*args, **kwargs)

    monkeypatch.setattr(task_view, "seal_files", sealing)

    def taken_over(run: Run) -> None:  # once the sealer has begun, the reaper takes the run
        assert begun.wait(30)
        Run.objects.filter(pk=run.pk).update(lease_token="taken-over")

    task_id = _executed(settings, lbox, taken_over)
    assert Task.objects.get(pk=task_id).state == "running"  # the finish was refused
    wait_for(lambda: sealed_on_disk(task_id), what="the layer's seal on disk")
    assert not Layer.objects.get(task_id=task_id).sealed  # the row waits for a final move
    run = Run.objects.get(task_id=task_id)
    assert reaper.hand_back(run.pk, "taken-over", "the reaper took it")
    again = Run.objects.filter(task_id=task_id, state="queued").get()
    jobs.execute_run(again.pk)
    assert Task.objects.get(pk=task_id).state == "done"
    monkeypatch.undo()
    assert lifecycle.release(task_id)
    layer = Layer.objects.get(task_id=task_id)
    assert layer.sealed and layer.manifest["paths"] == [{"path": "a.txt", "kind": "added"}]
    assert read(lbox, "a.txt") == "A\n"


def test_a_run_whose_lease_is_nearly_gone_leaves_the_seal_to_the_release(lbox, driver, settings, monkeypatch):
    overlay_only(driver)
    no_release(monkeypatch)
    threads = sealing_threads(monkeypatch)
    expired = threading.Event()
    lease_lasts = runs.lease_lasts
    monkeypatch.setattr(runs, "lease_lasts", lambda *args: expired.wait(30) and lease_lasts(*args))

    def expiring(run: Run) -> None:  # a worker whose heartbeats failed for most of a lease
        Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=1))
        expired.set()

    task_id = _executed(settings, lbox, expiring)
    assert Task.objects.get(pk=task_id).state == "done"
    assert lifecycle.janitor.drain()
    assert threads == [] and not sealed_on_disk(task_id)
    monkeypatch.undo()
    assert lifecycle.release(task_id) and sealed_on_disk(task_id) and Layer.objects.get(task_id=task_id).sealed

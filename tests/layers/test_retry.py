"""A retried task works on the layer its failure left: its earlier runs' files (and deletions) are
in the retried run's view on both drivers, even after the failure sealed the layer, and the
finished layer holds the changes of all its runs."""
from __future__ import annotations

from typing import Any

import pytest

from tasks.layers import disk, paths
from tasks.layers.tree import Meta
from tasks.run import lifecycle
from tests.conftest import Box
from tests.factories import flow
from tests.layers.conftest import diff_of, read

# Run 1 writes a file, deletes a base file and makes a directory, then runs out of actions
# before step 3; step 3 checks the view shows what run 1 left.
EARLIER_WORK = flow(
    {"write": {"path": "made/first.txt", "content": "from run 1\n"}},
    {"run": "rm gone.txt && echo one >> trail.txt"},
    {"run": "test -f made/first.txt && test ! -e gone.txt && grep -qx one trail.txt && echo two >> trail.txt && cat trail.txt",
     "save": "trail"},
)


def _sealed(task_id: str) -> bool:
    lifecycle.janitor.drain()  # the failure's release seals the layer in the background
    return Meta.load(paths.layer_dir(task_id)).sealed


def test_the_retried_run_sees_the_files_the_failed_runs_left(lbox: Box) -> None:
    (lbox.home / "gone.txt").write_text("base\n")
    (lbox.home / "kept.txt").write_text("base\n")
    task = lbox.create(title="runs out, then goes on", flow=EARLIER_WORK, limits={"max_actions": 2})
    failed = lbox.wait_state(task["id"], "failed")
    assert "limits.max_actions" in failed["hint"], failed
    assert _sealed(task["id"])  # the failure's release sealed it: the retry reopens a sealed layer
    response = lbox.api.post(f"/api/tasks/{task['id']}/retry", {"limits": {"max_actions": 3}}, format="json")
    assert response.status_code == 200, response.json()
    done = lbox.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done", done
    assert lbox.task(task["id"])["spent"]["actions"] == 3  # each step counted once: none ran twice
    assert read(lbox, "made/first.txt") == "from run 1\n"
    assert read(lbox, "trail.txt") == "one\ntwo\n"
    assert read(lbox, "gone.txt") is None and read(lbox, "kept.txt") == "base\n"
    body = diff_of(lbox, task["id"])
    assert sorted(body["added"]) == ["made/first.txt", "trail.txt"], body
    assert body["deleted"] == ["gone.txt"], body


def test_a_retry_after_a_later_change_in_the_same_run_keeps_only_the_last_state(lbox: Box) -> None:
    (lbox.home / "note.txt").write_text("base\n")
    task = lbox.create(title="changes back", limits={"max_actions": 1}, flow=flow(
        {"run": "echo changed > note.txt && echo scratch > scratch.txt"},
        {"run": "echo base > note.txt && rm scratch.txt && echo done > result.txt"},
    ))
    lbox.wait_state(task["id"], "failed")
    assert _sealed(task["id"])
    assert lbox.api.post(f"/api/tasks/{task['id']}/retry", {"limits": {"max_actions": 2}}, format="json").status_code == 200
    assert lbox.wait_state(task["id"], "done", "failed")["state"] == "done"
    # What run 1 changed and run 2 put back is no change at all; what run 2 removed is gone.
    body = diff_of(lbox, task["id"])
    assert (body["added"], body["modified"], body["deleted"]) == (["result.txt"], [], []), body


@pytest.mark.skipif(disk.unavailable() is not None, reason="no per-task disk image here")
def test_a_retry_that_raises_the_disk_limit_gets_an_image_of_that_size(lbox: Box) -> None:
    task = lbox.create(title="fills its disk", limits={"disk_mb": 16}, flow=flow(
        {"run": "dd if=/dev/zero of=first bs=1M count=8 2>/dev/null && echo one >> trail.txt"},
        {"run": "dd if=/dev/zero of=second bs=1M count=12 2>/dev/null && echo two >> trail.txt"},
    ))
    failed = lbox.wait_state(task["id"], "failed")
    assert failed["error"] == "disk limit of 16 MB reached" and "limits.disk_mb" in failed["hint"], failed
    assert _sealed(task["id"])
    response = lbox.api.post(f"/api/tasks/{task['id']}/retry", {"limits": {"disk_mb": 64}}, format="json")
    assert response.status_code == 200, response.json()
    done = lbox.wait_state(task["id"], "done", "failed")
    assert done["state"] == "done" and done["limits"]["disk_mb"] == 64, done
    assert read(lbox, "trail.txt") == "one\ntwo\n"  # step 1 did not run again
    second = paths.layer_dir(task["id"]) / "upper" / "second"
    assert second.stat().st_size == 12 * 2**20


@pytest.mark.skipif(disk.unavailable() is not None, reason="no per-task disk image here")
def test_what_the_layer_already_holds_counts_against_the_raised_disk_limit(lbox: Box) -> None:
    task = lbox.create(title="fills its disk", limits={"disk_mb": 16}, flow=flow(
        {"run": "dd if=/dev/zero of=first bs=1M count=12 2>/dev/null"},
        {"run": "dd if=/dev/zero of=second bs=1M count=12 2>/dev/null"},
    ))
    assert lbox.wait_state(task["id"], "failed")["error"] == "disk limit of 16 MB reached"
    assert _sealed(task["id"])
    # 20 MB: the 12 MB first file is in the layer already, so 12 MB more do not fit.
    assert lbox.api.post(f"/api/tasks/{task['id']}/retry", {"limits": {"disk_mb": 20}}, format="json").status_code == 200
    again: dict[str, Any] = lbox.wait_state(task["id"], "failed", "done")
    assert again["state"] == "failed" and again["error"] == "disk limit of 20 MB reached", again

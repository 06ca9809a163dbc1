"""Attacks on the owner's files through layers (both drivers, as root): a task that plants a
link or a special file must never make Keep write outside the owner's folders, nor make the
diff, the files API, a later task or a write step hang or break."""
from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tasks.layers.tree import copy_entry
from tests.factories import flow
from tests.layers.conftest import diff_of

DEADLINE_S = 30.0


def within(call: Callable[[], Any], seconds: float = DEADLINE_S) -> Any:
    """``call()``'s result, or a failure (not a hang) when it does not return in time."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except Exception as exc:  # noqa: BLE001 - raised again in the test thread below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds}s (a special file was opened?)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def finish(lbox, spec, **extra) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        task = lbox.create(title="attack", flow=spec, **extra)
        return lbox.wait_state(task["id"], "done", "failed")

    return within(run)


# --- overlapping folders ---------------------------------------------------------------------

def test_overlapping_or_duplicate_folders_are_refused_when_the_task_is_made(lbox, tmp_path):
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    alias = tmp_path / "alias"
    alias.symlink_to(project)
    for folders in ([str(project), str(project / "sub")], [str(project / "sub"), str(project)],
                    [str(project), str(project)], [str(project), str(alias)]):
        response = lbox.api.post("/api/tasks", {"title": "t", "folders": folders, "flow": flow({"run": "true"})},
                                 format="json")
        assert response.status_code == 400, (folders, response.json())
        assert response.json()["field"] == "folders"
    sibling = tmp_path / "project-2"
    sibling.mkdir()
    ok = lbox.api.post("/api/tasks", {"title": "t", "folders": [str(project), str(sibling)],
                                      "flow": flow({"run": "true"})}, format="json")
    assert ok.status_code == 201, ok.json()  # a shared name prefix is not nesting


# --- links on the way ------------------------------------------------------------------------

def test_keep_never_writes_through_a_link_that_replaced_a_folder(lbox, tmp_path):
    folder = tmp_path / "project"
    (folder / "sub" / "deep").mkdir(parents=True)
    elsewhere = tmp_path / "root-only"
    elsewhere.mkdir(mode=0o700)
    task = finish(lbox, flow({"write": {"path": "sub/deep/x.txt", "content": "planted\n"}},
                             {"delete": "sub/deep"}, {"write": {"path": "sub/new/y.txt", "content": "y\n"}}),
                  folder=str(folder))
    assert task["state"] == "done", task["error"]
    # before Keep, 'sub' becomes a link out of the folder (another program, or a kept task)
    os.rename(folder / "sub", tmp_path / "old-sub")
    (folder / "sub").symlink_to(elsewhere)

    body = within(lambda: lbox.api.post(f"/api/tasks/{task['id']}/keep"))
    assert body.status_code == 200, body.json()
    kept = body.json()
    assert kept["review"] == "conflict" and "sub/new/y.txt" in kept["conflicts"]
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert (folder / "sub").is_symlink()


def test_a_link_the_task_planted_is_kept_as_a_link_and_never_followed(lbox, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("root's\n")
    task = finish(lbox, flow({"run": f"ln -s {outside} out && ln -s {outside}/secret.txt s.txt"}), folder=str(folder))
    assert task["state"] == "done", task["error"]
    listing = within(lambda: diff_of(lbox, task["id"]))
    assert sorted(listing["added"]) == ["out", "s.txt"]
    assert "root's" not in listing["diff"]  # a link shows its target, not what it points at
    kept = lbox.api.post(f"/api/tasks/{task['id']}/keep").json()
    assert kept["review"] == "kept", kept
    assert os.readlink(folder / "out") == str(outside)
    assert (outside / "secret.txt").read_text() == "root's\n" and sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


# --- special files ---------------------------------------------------------------------------

def test_a_fifo_in_a_tasks_copy_is_listed_never_opened_and_later_tasks_still_run(lbox):
    task = finish(lbox, flow({"write": {"path": "a.txt", "content": "a\n"}}, {"run": "mkfifo pipe"}))
    assert task["state"] == "done", task["error"]

    body = within(lambda: diff_of(lbox, task["id"]))
    assert body["added"] == ["a.txt", "pipe"]
    assert body["special"] == [{"path": "pipe", "type": "fifo"}]
    assert "Special file pipe (fifo)" in body["diff"]

    listing = within(lambda: lbox.api.get("/api/workspaces/home/files", {"path": ""}).json())
    entry = next(e for e in listing["entries"] if e["name"] == "pipe")
    assert entry["type"] == "special" and entry["special"] == "fifo"
    one = within(lambda: lbox.api.get("/api/workspaces/home/files", {"path": "pipe"}))
    assert one.status_code == 200 and one.json()["type"] == "special" and one.json()["content"] is None

    later = finish(lbox, flow({"run": "test -p pipe && cat a.txt"}, {"write": {"path": "b.txt", "content": "b\n"}}))
    assert later["state"] == "done", later["error"]
    assert within(lambda: diff_of(lbox, later["id"]))["added"] == ["b.txt"]


def test_a_fifo_the_task_made_in_a_folder_is_a_conflict_at_keep(lbox, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "f.txt").write_text("old\n")
    task = finish(lbox, flow({"write": {"path": "f.txt", "content": "new\n"}}, {"run": "mkfifo pipe"}),
                  folder=str(folder))
    assert task["state"] == "done", task["error"]
    response = within(lambda: lbox.api.post(f"/api/tasks/{task['id']}/keep"))
    assert response.status_code == 200, response.content[:300]
    kept = response.json()
    assert kept["review"] == "conflict" and kept["conflicts"] == ["pipe"]
    assert (folder / "f.txt").read_text() == "old\n" and not os.path.lexists(folder / "pipe")
    note = lbox.api.get(f"/api/tasks/{task['id']}").json()
    assert note["review"] == "conflict"


def test_keep_never_opens_a_fifo_the_owner_has_where_the_task_wrote(lbox, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "f.txt").write_text("old\n")
    task = finish(lbox, flow({"write": {"path": "f.txt", "content": "new\n"}}), folder=str(folder))
    os.unlink(folder / "f.txt")
    os.mkfifo(folder / "f.txt")
    kept = within(lambda: lbox.api.post(f"/api/tasks/{task['id']}/keep")).json()
    assert kept["review"] == "conflict" and kept["conflicts"] == ["f.txt"]
    assert stat.S_ISFIFO(os.lstat(folder / "f.txt").st_mode)


def test_a_write_step_onto_a_fifo_fails_at_once_with_a_clear_error(lbox):
    task = finish(lbox, flow({"run": "mkfifo out"}, {"write": {"path": "out", "content": "never\n"}}))
    assert task["state"] == "failed"
    assert "not a regular file" in task["error"]


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_the_copy_of_a_special_file_is_a_new_node_never_opened(tmp_path, kind):

    source = tmp_path / "node"
    if kind == "fifo":
        os.mkfifo(source)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(source))
        server.close()
    within(lambda: copy_entry(source, tmp_path / "copy"), 10)
    assert stat.S_IFMT(os.lstat(tmp_path / "copy").st_mode) == stat.S_IFMT(os.lstat(source).st_mode)

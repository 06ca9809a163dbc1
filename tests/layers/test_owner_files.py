"""The owner's files are exact on both drivers: renames that keep size and mtime, folder tasks
with several folders, directories replaced or left empty, undo over a later task that only
touched a file, names that are not UTF-8, diffs read while a task seals, empty files."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from tasks.layers import paths as layer_paths
from tasks.layers.tree import Meta
from tasks.models import Task
from tasks.run import lifecycle
from tests.factories import flow
from tests.layers.conftest import diff_of, read, undo
from tests.pauses.helpers import cont

SAME_MTIME = "touch -d '2020-01-02 03:04:05' 'c d' 'New Folder/a'"


def finished(lbox, spec, **extra) -> dict[str, Any]:
    task = lbox.create(title="t", flow=spec, **extra)
    task = lbox.wait_state(task["id"], "done", "failed")
    assert task["state"] == "done", task["error"]
    return task


def keep(lbox, task_id: str) -> dict[str, Any]:
    response = lbox.api.post(f"/api/tasks/{task_id}/keep")
    assert response.status_code == 200, response.json()
    return response.json()


def listing(lbox, path: str = "") -> list[str]:
    response = lbox.api.get("/api/workspaces/home/files", {"path": path})
    assert response.status_code == 200, response.json()
    return [e["name"] for e in response.json()["entries"]]


# 1. a rename over a file of the same size and mtime

def test_a_rename_over_a_file_of_the_same_size_and_mtime_keeps_the_moved_bytes(lbox):
    finished(lbox, flow({"run": f"mkdir 'New Folder' && printf old1 > 'New Folder/a' && printf new2 > 'c d' && {SAME_MTIME}"}))
    moved = finished(lbox, flow({"run": "mv -f 'c d' 'New Folder/a'"}))
    assert read(lbox, "New Folder/a") == "new2"
    assert read(lbox, "c d") is None
    body = diff_of(lbox, moved["id"])
    assert body["modified"] == ["New Folder/a"] and body["deleted"] == ["c d"]


def test_keep_of_a_rename_over_a_same_size_same_mtime_file_moves_the_content(lbox, tmp_path):
    folder = tmp_path / "project"
    (folder / "New Folder").mkdir(parents=True)
    (folder / "New Folder" / "a").write_text("old1")
    (folder / "c d").write_text("new2")
    for name in ("c d", "New Folder/a"):
        os.utime(folder / name, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    task = finished(lbox, flow({"run": "mv -f 'c d' 'New Folder/a'"}), folder=str(folder))
    assert keep(lbox, task["id"])["review"] == "kept"
    assert (folder / "New Folder" / "a").read_text() == "new2"
    assert not (folder / "c d").exists()


# 2. two folders: modified is modified, deletions are applied

def test_a_two_folder_task_lists_and_keeps_modifications_and_deletions(lbox, tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    (first / "f.txt").write_text("old\n")
    (second / "g.txt").write_text("bye\n")
    (second / "stay.txt").write_text("stay\n")
    task = finished(lbox, flow({"write": {"path": "one/f.txt", "content": "new\n"}}, {"delete": "two/g.txt"}),
                    folders=[str(first), str(second)])
    body = diff_of(lbox, task["id"])
    assert body["modified"] == ["one/f.txt"] and body["added"] == [] and body["deleted"] == ["two/g.txt"]
    assert keep(lbox, task["id"])["review"] == "kept"
    assert (first / "f.txt").read_text() == "new\n"
    assert not (second / "g.txt").exists() and (second / "stay.txt").exists()


# 3. a directory replaced by a file

def test_a_directory_replaced_by_a_file_can_be_kept(lbox, tmp_path):
    folder = tmp_path / "project"
    (folder / "d" / "sub").mkdir(parents=True)
    (folder / "d" / "x.txt").write_text("x\n")
    task = finished(lbox, flow({"run": "rm -rf d && echo file > d"}), folder=str(folder))
    body = diff_of(lbox, task["id"])
    assert body["added"] == ["d"] and body["deleted"] == ["d/x.txt"]
    kept = keep(lbox, task["id"])
    assert kept["review"] == "kept", kept
    assert (folder / "d").read_text() == "file\n"


# 4. empty directories

def test_keep_carries_empty_directories_made_and_removed(lbox, tmp_path):
    folder = tmp_path / "project"
    (folder / "empty-old").mkdir(parents=True)
    (folder / "keep" / "inner").mkdir(parents=True)
    task = finished(lbox, flow({"run": "mkdir -p made/deeper && rmdir empty-old"}), folder=str(folder))
    assert keep(lbox, task["id"])["review"] == "kept"
    assert (folder / "made" / "deeper").is_dir()
    assert not (folder / "empty-old").exists()
    assert (folder / "keep" / "inner").is_dir()


def test_an_empty_directory_joins_the_workspace_and_its_removal_too(lbox):
    finished(lbox, flow({"run": "mkdir -p empty/inner"}))
    assert listing(lbox, "empty") == ["inner"]
    finished(lbox, flow({"run": "rmdir empty/inner"}))
    assert listing(lbox, "empty") == []


# 5. undo and copy-ups that changed nothing

def test_undo_reverts_a_file_a_later_task_only_touched(lbox):
    a = finished(lbox, flow({"write": {"path": "a.txt", "content": "A\n"}}))
    b = finished(lbox, flow({"run": "touch a.txt && sed -i s/zzz/y/ a.txt && cat a.txt > b.tmp && cat b.tmp > a.txt && rm b.tmp"}))
    body = diff_of(lbox, b["id"])
    assert body["added"] == body["modified"] == body["deleted"] == []
    undo(lbox, a["id"])
    assert read(lbox, "a.txt") is None  # B did not change it, so A's undo takes it away


def test_a_removed_and_remade_directory_holds_only_what_its_task_changed(lbox):
    finished(lbox, flow({"run": "mkdir d && echo y > d/y.txt"}))
    a = finished(lbox, flow({"delete": "d/y.txt"}))
    finished(lbox, flow({"write": {"path": "d/w.txt", "content": "w\n"}}))
    remade = finished(lbox, flow({"run": "rm -rf d && mkdir d && echo z > d/z.txt"}))
    assert diff_of(lbox, remade["id"])["deleted"] == ["d/w.txt"]
    undo(lbox, a["id"])
    # the remade directory changed only what it saw: y.txt, hidden by A alone, comes back
    assert listing(lbox, "d") == ["y.txt", "z.txt"]


def test_a_deletion_whose_file_was_undone_beneath_it_shows_nothing_in_a_later_view(lbox):
    made = finished(lbox, flow({"write": {"path": "d/x.txt", "content": "x\n"}}))
    finished(lbox, flow({"run": "rm -rf d && mkdir d"}))  # a new directory holding a deletion of x.txt
    undo(lbox, made["id"])
    assert listing(lbox, "d") == []
    later = lbox.create(title="look", flow=flow({"run": "test -d d && test -z \"$(ls -A d)\""}))
    later = lbox.wait_state(later["id"], "done", "failed")
    assert later["state"] == "done", later["error"]  # no unreadable whiteout listed in the real view


def test_a_hard_link_a_task_makes_is_a_copy_for_later_tasks(lbox):
    finished(lbox, flow({"write": {"path": "a.txt", "content": "A\n"}}))
    linked = finished(lbox, flow({"run": "ln a.txt b.txt"}))
    assert diff_of(lbox, linked["id"])["added"] == ["b.txt"]
    assert diff_of(lbox, linked["id"])["modified"] == []
    finished(lbox, flow({"run": "echo changed > a.txt"}))
    assert read(lbox, "a.txt") == "changed\n" and read(lbox, "b.txt") == "A\n"


# 6. names that are not UTF-8

def test_a_name_that_is_not_utf8_is_shown_escaped_and_can_be_named(lbox):
    task = finished(lbox, flow({"run": "printf hi > \"$(printf 'caf\\351')\""}))
    body = diff_of(lbox, task["id"])
    assert body["added"] == ["caf\\xe9"]
    assert "b/caf\\xe9" in body["diff"]
    assert "caf\\xe9" in listing(lbox)
    assert read(lbox, "caf\\xe9") == "hi"
    view = lbox.api.get(f"/api/tasks/{task['id']}")
    assert view.status_code == 200


def test_keep_writes_a_name_that_is_not_utf8_byte_for_byte(lbox, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    task = finished(lbox, flow({"run": "printf hi > \"$(printf 'caf\\351')\""}), folder=str(folder))
    assert diff_of(lbox, task["id"])["added"] == ["caf\\xe9"]
    kept = keep(lbox, task["id"])
    assert kept["review"] == "kept", kept
    assert os.listdir(os.fsencode(folder)) == [b"caf\xe9"]
    assert (folder / os.fsdecode(b"caf\xe9")).read_text() == "hi"


# 7. a diff read while the copy driver seals is never empty

def test_a_diff_read_while_the_task_ends_is_never_empty(lbox):
    count = 1500
    spec = flow({"run": f"mkdir many && cd many && seq {count} | xargs touch"})
    done: dict[str, Any] = {}

    def run() -> None:
        task = lbox.create(title="many", flow=spec)
        done["task"] = task

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    seen_full = False
    sizes: list[int] = []
    deadline = time.monotonic() + 120
    # Read until the layer is sealed (its release runs in the background after the run ends),
    # and at least once after the run ended.
    while time.monotonic() < deadline:
        ended = not worker.is_alive()
        row = Task.objects.order_by("-created_at").values_list("pk", flat=True).first()
        if row is not None:
            size = len(diff_of(lbox, row)["added"])
            sizes.append(size)
            if seen_full:
                assert size == count, f"a diff read during the seal had {size} paths: {sizes[-5:]}"
            seen_full = seen_full or size == count
            if ended and Meta.load(layer_paths.layer_dir(row)).sealed:
                break
    worker.join(30)
    assert seen_full and len(diff_of(lbox, done["task"]["id"])["added"]) == count


# 9. empty files

def test_an_empty_file_added_or_deleted_has_unified_diff_headers(lbox):
    added = finished(lbox, flow({"run": "touch empty.txt"}))
    assert diff_of(lbox, added["id"])["diff"] == "--- /dev/null\n+++ b/empty.txt\n"
    gone = finished(lbox, flow({"delete": "empty.txt"}))
    assert diff_of(lbox, gone["id"])["diff"] == "--- a/empty.txt\n+++ /dev/null\n"


# 8. tasks that overlap on one workspace: the last to finish wins, and says so

def test_the_last_overlapping_task_to_finish_wins_and_its_log_says_what_it_overrode(lbox):
    finished(lbox, flow({"write": {"path": "d/old.txt", "content": "old\n"}}))
    slow = lbox.create(title="slow", flow=flow({"checkpoint": "look first"}, {"delete": "d"},
                                               {"write": {"path": "both.txt", "content": "slow\n"}}))
    lbox.wait_state(slow["id"], "waiting")  # its view is open over the stack as it was
    fast = finished(lbox, flow({"write": {"path": "d/new.txt", "content": "new\n"}},
                               {"write": {"path": "both.txt", "content": "fast\n"}}))
    assert read(lbox, "d/new.txt") == "new\n"
    assert cont(lbox, slow["id"], approve=True).status_code == 200
    slow = lbox.wait_state(slow["id"], "done", "failed")
    assert slow["state"] == "done", slow["error"]

    assert read(lbox, "both.txt") == "slow\n" and read(lbox, "d/new.txt") is None  # the last writer wins
    assert lifecycle.janitor.drain()  # the note is the release's, written after the layer's seal
    events = lbox.events(slow["id"])
    notes = [e for e in events if e["kind"] == "note" and "last to finish wins" in e["summary"]]
    assert len(notes) == 1, [e["summary"] for e in events]
    assert notes[0]["data"]["overrides"] == {fast["id"]: ["both.txt", "d/new.txt"]}
    assert f"from task {fast['id']}" in notes[0]["summary"]

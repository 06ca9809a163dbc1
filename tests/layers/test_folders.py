"""Folder tasks: the real folder is untouched until Keep; Keep refuses when the owner changed
the same paths meanwhile; Undo discards; only the owner hands out folders."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from tests.factories import flow
from tests.layers.conftest import diff_of, undo

EDITS = flow(
    {"write": {"path": "f.txt", "content": "new\n"}},
    {"write": {"path": "sub/new.txt", "content": "n\n"}},
    {"delete": "gone.txt"},
    {"delete": "old"},
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "old" / "deep").mkdir(parents=True)
    (root / "f.txt").write_text("old\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "other.txt").write_text("mine\n")
    (root / "old" / "deep" / "o.txt").write_text("o\n")
    return root


def finished(lbox, spec, **extra):
    task = lbox.create(title="folder work", flow=spec, **extra)
    task = lbox.wait_state(task["id"], "done", "failed")
    assert task["state"] == "done", task["error"]
    return task


def keep(lbox, task_id):
    response = lbox.api.post(f"/api/tasks/{task_id}/keep")
    assert response.status_code == 200, response.json()
    return response.json()


def untouched(folder: Path) -> bool:
    return ((folder / "f.txt").read_text() == "old\n" and (folder / "gone.txt").exists()
            and (folder / "old" / "deep" / "o.txt").exists() and not (folder / "sub").exists())


def test_keep_applies_changes_and_deletions_only_when_asked(lbox, folder):
    task = finished(lbox, EDITS, folder=str(folder))
    assert task["review"] == "pending" and "keep" in task["next"]
    assert untouched(folder)
    change = diff_of(lbox, task["id"])
    assert change["added"] == ["sub/new.txt"] and change["modified"] == ["f.txt"]
    assert change["deleted"] == ["gone.txt", "old/deep/o.txt"]

    kept = keep(lbox, task["id"])
    assert kept["review"] == "kept" and kept["conflicts"] == []
    assert (folder / "f.txt").read_text() == "new\n"
    assert (folder / "sub" / "new.txt").read_text() == "n\n"
    assert not (folder / "gone.txt").exists() and not (folder / "old").exists()
    assert (folder / "other.txt").read_text() == "mine\n"
    assert not [p for p in folder.rglob("*") if ".box-" in p.name]  # no temp files left
    assert "undo" not in kept["next"]
    assert lbox.api.post(f"/api/tasks/{task['id']}/undo").status_code == 409


def test_keep_refuses_when_the_owner_changed_the_same_file_and_applies_nothing(lbox, folder):
    task = finished(lbox, EDITS, folder=str(folder))
    (folder / "f.txt").write_text("owner's\n")
    (folder / "other.txt").write_text("unrelated edit\n")
    body = keep(lbox, task["id"])
    assert body["review"] == "conflict" and body["conflicts"] == ["f.txt"]
    assert (folder / "f.txt").read_text() == "owner's\n"
    assert (folder / "gone.txt").exists() and not (folder / "sub").exists()


def test_a_same_size_edit_with_the_old_mtime_is_still_a_conflict(lbox, folder):
    task = finished(lbox, EDITS, folder=str(folder))
    st = os.stat(folder / "gone.txt")
    (folder / "gone.txt").write_text("BYE\n")  # same size
    os.utime(folder / "gone.txt", ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime
    body = keep(lbox, task["id"])
    assert body["review"] == "conflict" and body["conflicts"] == ["gone.txt"]
    assert (folder / "gone.txt").read_text() == "BYE\n" and (folder / "f.txt").read_text() == "old\n"


def test_a_file_the_owner_adds_to_a_directory_the_task_deleted_is_a_conflict(lbox, folder):
    task = finished(lbox, EDITS, folder=str(folder))
    (folder / "old" / "fresh.txt").write_text("keep me\n")
    body = keep(lbox, task["id"])
    assert body["review"] == "conflict" and "old/fresh.txt" in body["conflicts"]
    assert (folder / "old" / "fresh.txt").exists()


def test_undo_discards_and_leaves_the_folder_as_it_was(lbox, folder):
    task = finished(lbox, EDITS, folder=str(folder))
    undone = undo(lbox, task["id"])
    assert undone["state"] == "undone" and undone["review"] == "undone"
    assert untouched(folder)
    assert diff_of(lbox, task["id"])["modified"] == []
    assert lbox.api.post(f"/api/tasks/{task['id']}/keep").status_code == 409


def test_several_folders_each_appear_under_their_name(lbox, tmp_path):
    first, second = tmp_path / "a" / "src", tmp_path / "b" / "src"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "one.txt").write_text("1\n")
    task = finished(lbox, flow({"run": "ls; cat src/one.txt > src-2/copied.txt"}), folders=[str(first), str(second)])
    assert diff_of(lbox, task["id"])["added"] == ["src-2/copied.txt"]
    assert not (second / "copied.txt").exists()
    assert keep(lbox, task["id"])["review"] == "kept"
    assert (second / "copied.txt").read_text() == "1\n"


def test_a_token_without_the_folders_right_cannot_hand_out_or_keep_a_folder(lbox, folder):
    task = finished(lbox, EDITS, folder=str(folder))
    _, raw = issue_api_token(lbox.owner, "no folders", can_use_folders=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/tasks", {"title": "t", "folder": str(folder), "flow": EDITS}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN"
    response = client.post(f"/api/tasks/{task['id']}/keep")
    assert response.status_code == 403 and response.json()["code"] == "FORBIDDEN"
    assert untouched(folder)

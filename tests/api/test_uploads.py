"""Files in and out of a workspace: ``PUT /api/workspaces/<name>/files/<path>`` writes a file as
a layer of its own, recorded by a done task (undo takes it out again), and ``GET`` reads a
file's bytes as the workspace stands now."""
from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from boxsite.core.auth import DEVICE_COOKIE, issue_api_token
from tasks.models import Task
from tests.conftest import Box
from tests.factories import flow
from tests.portal.conftest import pair_device

FILES = "/api/workspaces/home/files"


def put(box: Box, path: str, data: bytes, **extra: Any) -> Any:
    return box.api.put(f"{FILES}/{path}", data, content_type="application/octet-stream", **extra)


def output_of(box: Box, task_id: str) -> str:
    return " ".join(str(e["data"]) for e in box.events(task_id))


def test_an_uploaded_file_is_read_by_a_task_and_undoing_the_upload_takes_it_out(box: Box) -> None:
    uploaded = put(box, "inbox/the-file.txt", b"sent from afar\n")
    assert uploaded.status_code == 201, uploaded.json()
    upload = uploaded.json()
    assert upload["path"] == "inbox/the-file.txt" and upload["size"] == 15
    assert upload["task"]["state"] == "done" and upload["task"]["source"] == "upload"

    reader = box.create(title="read it", flow=flow({"run": "cat inbox/the-file.txt"}))
    box.wait_state(reader["id"], "done")
    assert "sent from afar" in output_of(box, reader["id"])

    later = box.create(title="later", flow=flow({"write": {"path": "later.txt", "content": "stays"}}))
    box.wait_state(later["id"], "done")

    history = box.api.get("/api/tasks", {"limit": 50}).json()["results"]
    assert upload["task"]["id"] in [t["id"] for t in history]
    diff = box.api.get(f"/api/tasks/{upload['task']['id']}/diff").json()
    assert diff["added"] == ["inbox/the-file.txt"]

    undone = box.api.post(f"/api/tasks/{upload['task']['id']}/undo")
    assert undone.status_code == 200 and undone.json()["state"] == "undone"

    gone = box.api.get(f"{FILES}/inbox/the-file.txt")
    assert gone.status_code == 404 and gone.json()["code"] == "NOT_FOUND"
    assert box.api.get(f"{FILES}/later.txt").getvalue() == b"stays"
    check = box.create(title="look again", flow=flow({"run": "test ! -e inbox/the-file.txt && cat later.txt"}))
    assert box.wait_state(check["id"], "done", "failed")["state"] == "done"


def test_a_file_is_read_back_with_its_type_and_as_an_attachment(box: Box) -> None:
    assert put(box, "report.csv", b"a,b\n1,2\n").status_code == 201
    response = box.api.get(f"{FILES}/report.csv")
    assert response.status_code == 200 and response.getvalue() == b"a,b\n1,2\n"
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment")
    assert put(box, "blob", bytes(range(256))).status_code == 201
    blob = box.api.get(f"{FILES}/blob", HTTP_ACCEPT="application/octet-stream")
    assert blob.status_code == 200 and blob.getvalue() == bytes(range(256))
    assert blob["Content-Type"] == "application/octet-stream"


def test_replacing_a_file_keeps_its_mode_and_the_same_bytes_change_nothing(box: Box) -> None:
    (box.home / "run.sh").write_text("echo one\n")
    (box.home / "run.sh").chmod(0o755)
    assert put(box, "run.sh", b"echo two\n").status_code == 201
    ran = box.create(title="run it", flow=flow({"run": "./run.sh"}))
    box.wait_state(ran["id"], "done")
    assert "two" in output_of(box, ran["id"])
    again = put(box, "run.sh", b"echo two\n").json()
    assert box.api.get(f"/api/tasks/{again['task']['id']}/diff").json()["modified"] == []


def test_paths_that_leave_the_workspace_or_go_through_a_link_are_refused(box: Box) -> None:
    outside = box.home.parent / "outside"
    outside.mkdir()
    (box.home / "out").symlink_to(outside)
    (box.home / "dir").mkdir()
    refused = {
        "a/../../etc/passwd": 400,
        "out/x.txt": 409,
        "dir": 409,
        "%00x": 400,
    }
    for path, status in refused.items():
        response = put(box, path, b"x")
        assert response.status_code == status, (path, response.content)
        assert set(response.json()) >= {"code", "message", "field"}
    assert list(outside.iterdir()) == []


def test_a_file_over_the_limit_is_413(box: Box, settings: Any) -> None:
    settings.BOX_UPLOAD_MAX_MB = 1
    response = put(box, "big.bin", b"x" * (1024 * 1024 + 1))
    assert response.status_code == 413 and response.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert box.api.get(f"{FILES}/big.bin").status_code == 404


def test_a_missing_file_a_folder_and_another_workspace_answer_in_the_error_shape(box: Box) -> None:
    assert box.api.get(f"{FILES}/nothing.txt").json()["code"] == "NOT_FOUND"
    (box.home / "dir").mkdir()
    assert box.api.get(f"{FILES}/dir").status_code == 409
    assert box.api.put("/api/workspaces/nowhere/files/a.txt", b"x", content_type="text/plain").status_code == 404


def test_a_paired_phone_may_read_but_not_upload(box: Box) -> None:
    phone = APIClient()
    phone.cookies[DEVICE_COOKIE] = pair_device(box.api)
    (box.home / "seen.txt").write_text("hello")
    assert phone.get(f"{FILES}/seen.txt").status_code == 200
    refused = phone.put(f"{FILES}/new.txt", b"x", content_type="application/octet-stream")
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
    assert phone.get(f"{FILES}/new.txt").status_code == 404
    assert not Task.objects.filter(source="upload").exists()


def test_any_api_token_may_upload_one_without_the_folder_right_too(box: Box) -> None:
    """Uploads need no right of their own (docs/internals/decisions.md): the only right a token
    carries, host folders, is about the owner's disk outside the box, not a workspace."""
    _, raw = issue_api_token(box.owner, "no folders")
    program = APIClient()
    program.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert program.post("/api/tasks", {"title": "t", "prompt": "p", "folders": [str(box.home)]},
                        format="json").status_code == 403  # the right it lacks
    made = program.put(f"{FILES}/from-a-program.txt", b"hi", content_type="application/octet-stream")
    assert made.status_code == 201, made.content
    assert b"".join(program.get(f"{FILES}/from-a-program.txt").streaming_content) == b"hi"


def test_an_upload_is_not_run_again(box: Box) -> None:
    upload = put(box, "a.txt", b"a").json()
    again = box.api.post(f"/api/tasks/{upload['task']['id']}/rerun", {}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "CONFLICT"

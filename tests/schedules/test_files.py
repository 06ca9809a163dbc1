"""File-arrival triggers: one task per new file once it is stable, never twice."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rest_framework.test import APIClient

from boxsite.core.auth import issue_api_token
from schedules.files import scan_all
from schedules.models import SeenFile, Trigger
from tests.conftest import Box
from tests.schedules.conftest import run_scheduler_once, tasks_from


def watch(box: Box, folder: Path, name: str = "inbox", **body: Any) -> dict[str, Any]:
    body.setdefault("settleSeconds", 0)
    body.setdefault("template", {"title": "file ${file.name}", "prompt": "read ${file.path}"})
    response = box.api.post("/api/triggers", {"name": name, "kind": "file", "folder": str(folder), **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_each_new_file_starts_one_task_with_its_path_as_a_fact(box: Box, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watch(box, inbox)
    (inbox / "a.csv").write_text("1,2\n")
    (inbox / "b.csv").write_text("3,4\n")
    (inbox / ".hidden").write_text("x")
    (inbox / "c.csv.part").write_text("still downloading")

    assert scan_all() == 0  # first sighting: settling
    assert scan_all() == 2  # unchanged since: started
    assert scan_all() == 0

    tasks = sorted(tasks_from(box, "file:inbox"), key=lambda t: t["title"])
    assert [t["title"] for t in tasks] == ["file a.csv", "file b.csv"]
    assert tasks[0]["facts"]["file.path"] == str((inbox / "a.csv").resolve())
    assert tasks[0]["prompt"] == f"read {(inbox / 'a.csv').resolve()}"


def test_a_file_still_being_written_is_not_picked_up_until_it_is_stable(box: Box, tmp_path: Path) -> None:
    watch(box, tmp_path)
    growing = tmp_path / "video.mp4"
    growing.write_bytes(b"x" * 1000)
    assert scan_all() == 0
    with growing.open("ab") as handle:
        handle.write(b"y" * 1000)
    assert scan_all() == 0  # changed since the last scan: seen again, not started
    assert scan_all() == 1
    [task] = tasks_from(box, "file:inbox")
    assert task["facts"]["file.size"] == "2000"


def test_a_recently_modified_file_waits_for_the_settle_time(box: Box, tmp_path: Path) -> None:
    watch(box, tmp_path, settleSeconds=3600)
    (tmp_path / "fresh.txt").write_text("hello")
    assert scan_all() == 0 and scan_all() == 0
    assert tasks_from(box, "file:inbox") == []


def test_no_file_starts_a_second_task_after_a_restart(box: Box, tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    watch(box, inbox)
    (inbox / "report.pdf").write_bytes(b"%PDF-1.7")
    # Two ticks of the real scheduler process, then two more in a fresh process.
    run_scheduler_once(tmp_path)
    run_scheduler_once(tmp_path)
    assert len(tasks_from(box, "file:inbox")) == 1
    run_scheduler_once(tmp_path)
    assert scan_all() == 0
    assert len(tasks_from(box, "file:inbox")) == 1

    # A different file under the same name (new content) is a new arrival.
    (inbox / "report.pdf").write_bytes(b"%PDF-1.7 second edition")
    assert scan_all() == 0 and scan_all() == 1
    assert len(tasks_from(box, "file:inbox")) == 2


def test_a_paused_file_trigger_starts_nothing(box: Box, tmp_path: Path) -> None:
    trigger = watch(box, tmp_path)
    box.api.post(f"/api/triggers/{trigger['id']}/pause")
    (tmp_path / "a.txt").write_text("a")
    assert scan_all() == 0 and scan_all() == 0
    assert tasks_from(box, "file:inbox") == []


def test_only_the_owner_may_watch_a_folder(box: Box, tmp_path: Path) -> None:
    _, raw = issue_api_token(box.owner, "no folders", can_use_folders=False)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post("/api/triggers", {"name": "sneaky", "kind": "file", "folder": str(tmp_path),
                                             "template": {"title": "t", "prompt": "p"}}, format="json")
    assert response.status_code == 403 and response.json()["field"] == "folder"
    relative = box.api.post("/api/triggers", {"name": "rel", "kind": "file", "folder": "inbox",
                                              "template": {"title": "t", "prompt": "p"}}, format="json")
    assert relative.status_code == 400 and relative.json()["field"] == "folder"


def test_on_several_machines_only_the_machine_that_has_the_folder_scans_it(
        box: Box, tmp_path: Path, settings: Any) -> None:
    settings.BOX_MACHINE = "a"
    made = watch(box, tmp_path)
    (tmp_path / "a.csv").write_text("1\n")
    assert Trigger.objects.get(pk=made["id"]).machine == "a"

    settings.BOX_MACHINE = "b"  # another machine's scheduler: the folder at that path is not its
    assert scan_all() == 0
    assert not SeenFile.objects.exists()
    settings.BOX_MACHINE = "a"
    assert scan_all() == 0
    assert list(SeenFile.objects.values_list("path", flat=True)) == [str((tmp_path / "a.csv").resolve())]

    # A trigger named before the box had several machines goes to the first that has its folder.
    Trigger.objects.filter(pk=made["id"]).update(machine="", folder=str(tmp_path / "elsewhere"))
    settings.BOX_MACHINE = "b"
    scan_all()
    assert Trigger.objects.get(pk=made["id"]).machine == ""  # b has no such folder
    (tmp_path / "elsewhere").mkdir()
    scan_all()
    assert Trigger.objects.get(pk=made["id"]).machine == "b"

"""The one access rule, on every route and stream of a task (docs/internals/decisions.md: "Who may see
and act on a task"): the owner reaches every task; a paired phone reaches the tasks it started,
never a folder task, and answers the approvals and questions of its inbox."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from rest_framework.test import APIClient

from approvals import urls as approval_urls
from approvals.models import Approval, ApprovalState
from boxsite.core.auth import DEVICE_COOKIE
from tasks.api import urls as task_urls
from tasks.models import Task
from tasks.services import note
from tests.conftest import Box
from tests.factories import flow
from tests.portal.conftest import pair_device, ws

WAITS_FOR_AN_OK = flow({"approve": "go on?"}, {"write": {"path": "done.txt", "content": "ok"}})

# Every route of one task: (method, path after /api/tasks/<id>, body).
TASK_ROUTES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "task-detail": ("get", "", {}),
    "task-events": ("get", "/events", {}),
    "task-report": ("get", "/report", {}),
    "task-diff": ("get", "/diff", {}),
    "task-continue": ("post", "/continue", {"approve": True}),
    "task-keep": ("post", "/keep", {}),
    "task-cancel": ("post", "/cancel", {}),
    "task-undo": ("post", "/undo", {}),
    "task-rerun": ("post", "/rerun", {}),
    "task-retry": ("post", "/retry", {}),
    "task-artifact": ("get", "/artifacts/out.txt", {}),
    "task-runs": ("get", "/runs", {}),
    "task-actions": ("get", "/actions", {}),
    "task-dependencies": ("post", "/dependencies", {"task": "tk0nothere"}),
}


class Scene:
    """The owner's task, the owner's folder task and the phone's own task, each waiting for an
    OK, and the paired phone's API client."""

    def __init__(self, box: Box, folder: Path) -> None:
        self.box = box
        self.device = pair_device(box.api)
        self.phone = APIClient()
        self.phone.cookies[DEVICE_COOKIE] = self.device
        made = self.phone.post("/api/tasks", {"title": "from the phone", "flow": WAITS_FOR_AN_OK}, format="json")
        assert made.status_code == 201, made.json()
        self.phones = made.json()["id"]
        self.owners = box.create(title="the owner's", flow=WAITS_FOR_AN_OK)["id"]
        self.folders = box.create(title="on a folder", folder=str(folder), flow=WAITS_FOR_AN_OK)["id"]
        for task_id in (self.phones, self.owners, self.folders):
            box.wait_state(task_id, "waiting")

    def approval_of(self, task_id: str) -> int:
        return Approval.objects.get(task_id=task_id, state=ApprovalState.PENDING).pk


@pytest.fixture
def scene(box: Box, tmp_path: Path) -> Scene:
    folder = tmp_path / "real-folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    return Scene(box, folder)


def _call(client: APIClient, route: str, task_id: str) -> Any:
    method, suffix, body = TASK_ROUTES[route]
    return getattr(client, method)(f"/api/tasks/{task_id}{suffix}", body, format="json")


def test_the_table_names_every_route_of_a_task() -> None:
    routes = {p.name for p in [*task_urls.urlpatterns, *approval_urls.urlpatterns] if "<str:task_id>" in str(p.pattern)}
    assert routes == set(TASK_ROUTES)


@pytest.mark.parametrize("route", list(TASK_ROUTES))
def test_a_phone_cannot_reach_the_owners_tasks_or_folder_tasks_on_any_route(scene: Scene, route: str) -> None:
    for task_id in (scene.owners, scene.folders):
        before = Task.objects.values_list("state", "version").get(pk=task_id)
        response = _call(scene.phone, route, task_id)
        assert response.status_code == 404, (route, task_id, response.json())
        assert response.json()["message"] == f"no task '{task_id}'"  # as if it did not exist
        assert Task.objects.values_list("state", "version").get(pk=task_id) == before  # nothing happened


@pytest.mark.parametrize("route", list(TASK_ROUTES))
def test_a_phone_reaches_the_task_it_started_on_every_route(scene: Scene, route: str) -> None:
    response = _call(scene.phone, route, scene.phones)
    assert response.status_code < 500
    if response.status_code == 404:  # a missing artifact, never a missing task
        assert "no task" not in response.json()["message"], route


@pytest.mark.parametrize("route", ["task-detail", "task-events", "task-report", "task-diff"])
def test_the_owner_reaches_every_task(scene: Scene, route: str) -> None:
    for task_id in (scene.phones, scene.owners, scene.folders):
        assert _call(scene.box.api, route, task_id).status_code == 200, (route, task_id)


def test_a_phone_lists_only_the_tasks_it_started(scene: Scene) -> None:
    listed = [t["id"] for t in scene.phone.get("/api/tasks").json()["results"]]
    assert listed == [scene.phones]
    owner_listed = {t["id"] for t in scene.box.api.get("/api/tasks").json()["results"]}
    assert owner_listed == {scene.phones, scene.owners, scene.folders}


def test_a_phone_answers_the_inbox_of_every_non_folder_task_and_nothing_of_a_folder_task(scene: Scene) -> None:
    inbox = scene.phone.get("/api/inbox").json()
    assert {a["task"] for a in inbox["approvals"]} == {scene.phones, scene.owners}
    folder_approval = scene.approval_of(scene.folders)
    assert scene.phone.get(f"/api/approvals/{folder_approval}").status_code == 404
    assert scene.phone.post(f"/api/approvals/{folder_approval}/approve").status_code == 404
    approved = scene.phone.post(f"/api/approvals/{scene.approval_of(scene.owners)}/approve")
    assert approved.status_code == 200, approved.json()
    scene.box.wait_state(scene.owners, "done")
    assert scene.box.task(scene.folders)["state"] == "waiting"


def test_the_task_page_is_the_owners_alone(scene: Scene) -> None:
    page = scene.phone.get(f"/tasks/{scene.owners}")
    assert page.status_code == 302 and page["Location"].startswith("/login")


@pytest.mark.django_db(transaction=True)
async def test_a_phone_streams_only_the_task_it_started(scene: Scene, stream_connections_closed: None) -> None:
    for task_id, allowed in ((scene.phones, True), (scene.owners, False), (scene.folders, False)):
        client = ws(f"/ws/tasks/{task_id}/", device=scene.device)
        connected, code = await client.connect()
        assert connected == allowed, task_id
        if connected:
            await client.disconnect()
        else:
            assert code == 4403


@pytest.mark.django_db(transaction=True)
async def test_a_phones_list_stream_carries_only_the_tasks_it_started(scene: Scene, stream_connections_closed: None) -> None:
    client = ws("/ws/tasks/", device=scene.device)
    assert (await client.connect())[0]
    for task_id in (scene.owners, scene.folders, scene.phones):
        task = await database_sync_to_async(Task.objects.get)(pk=task_id)
        await database_sync_to_async(note)(task, "something happened")
    seen: set[str] = set()
    while scene.phones not in seen:
        frame = await client.receive_json_from(timeout=10)
        if frame["type"] == "task":
            seen.add(frame["task"]["id"])
    assert seen == {scene.phones}
    await client.disconnect()

"""A task's Linux user is removed when the box stops and made again by its next run, usually with
another uid: the task must still be able to change the files it made before."""
from __future__ import annotations

import os
import subprocess

import pytest

from tasks import sandbox
from tasks.layers import unmount_views
from tasks.sandbox import users
from tests.factories import flow

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="task users need root")


def test_a_task_whose_user_is_made_again_can_still_change_its_own_files(box):
    spec = flow({"run": "mkdir -p notes && echo first >> notes/log.txt"},
                {"ask": {"name": "colour", "why": "which colour"}},
                {"run": "echo ${colour} >> notes/log.txt"}, {"run": "cat notes/log.txt", "save": "log"})
    task = box.create(title="made again", flow=spec)
    box.wait_state(task["id"], "waiting")
    before = users.ensure_user(task["id"])
    # What a stop does to an active task: its processes, user and view go; the next run makes them again.
    sandbox.release(task["id"])
    unmount_views([task["id"]])
    # Another account takes the old uid, so the task's next user cannot get it back. ``-o``: a user
    # another test's box made meanwhile may have taken the freed uid first (useradd hands out the
    # highest free one); the squatter shares it then, and the uid stays taken either way.
    squatter = f"boxsquat{os.getpid()}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "-o", "-u",
                    str(before.uid), squatter], check=True, capture_output=True)
    try:
        response = box.api.post(f"/api/tasks/{task['id']}/continue", {"inputs": {"colour": "red"}}, format="json")
        assert response.status_code == 200, response.json()
        view = box.wait_state(task["id"], "done", "failed", timeout=60)
    finally:
        subprocess.run(["userdel", squatter], check=False, capture_output=True)
    assert view["state"] == "done", view["error"]
    assert box.api.get(f"/api/tasks/{task['id']}/report").json()["records"]["log"] == "first\nred"

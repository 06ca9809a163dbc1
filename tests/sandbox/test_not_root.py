"""A box started by an ordinary Linux user: it never runs a task unsandboxed unless told.

The whole box (``runbox``: web, worker, scheduler) runs as ``nobody`` on an embedded database in
a data directory of its own. Until the owner sets ``BOX_SANDBOX=off`` a task fails at its start
with the reason and the fix, and nothing of it runs; the banner, ``/api/health``, Settings and
``doctor`` say which mode the box is in. With ``BOX_SANDBOX=off`` the same task, retried, runs as ``nobody``.
"""
from __future__ import annotations

import http.cookiejar
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.cluster import stop
from tests.conftest import free_port, wait_for

ROOT = Path(settings.BASE_DIR)
PASSWORD = "a-long-password"
# Runs a command as the user (``setpriv``) in a mount namespace of its own, where the box's
# interpreter is within the user's reach: one that lives under a directory the user cannot enter
# (a root's pyenv under /root) is shown there alone, on a tmpfs over that directory. Nothing of
# this shows outside the namespace, and it goes with the box's processes.
AS_USER = """set -e
if [ -n "$HIDDEN" ]; then
  mount --bind "$BASE" "$HOLD"
  mount -t tmpfs -o mode=0755,size=1m box-test "$HIDDEN"
  mkdir -p "$BASE"
  mount --bind "$HOLD" "$BASE"
fi
exec setpriv --reuid="$AS_UID" --regid="$AS_GID" --clear-groups -- "$@"
"""


def _hidden_above(path: Path) -> Path | None:
    """The outermost directory above ``path`` that others cannot enter, or None."""
    for parent in reversed(path.parents):
        if not parent.stat().st_mode & 0o001:
            return parent
    return None

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching to an unprivileged user needs root")


class OrdinaryBox:
    """The box's commands, run as ``nobody``."""

    def __init__(self, data: Path, hold: Path) -> None:
        self.user = pwd.getpwnam("nobody")
        self.data = data
        base = Path(sys.base_prefix).resolve()
        hidden = _hidden_above(base / "bin")
        self.wrapper = {"AS_UID": str(self.user.pw_uid), "AS_GID": str(self.user.pw_gid), "BASE": str(base),
                        "HOLD": str(hold), "HIDDEN": str(hidden or "")}
        self.port = str(free_port())
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(data),
            "PYTHONDONTWRITEBYTECODE": "1",
            "BOX_DATA_DIR": str(data), "BOX_HOST": "127.0.0.1", "BOX_PORT": self.port,
            "BOX_QUEUE_NAME": f"not-root-{os.getpid()}", "BOX_QUEUE_POLL_S": "0.05",
        }
        self.token = ""

    def _argv(self, *args: str) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", AS_USER, "sh",
                sys.executable, str(ROOT / "manage.py"), *args]

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._argv(*args), env={**self.env, **self.wrapper, **env}, capture_output=True,
                              text=True, timeout=180, cwd=ROOT)

    def manage(self, *args: str, **env: str) -> str:
        done = self.run(*args, **env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start(self, log: Path, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self._argv("runbox"), env={**self.env, **self.wrapper, **env}, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return bool(self.call("GET", "/api/health")["ok"])
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for(up, timeout=90, what="the box to answer")
        return proc

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def settings_page(self) -> str:
        """The portal's Settings, signed in as the owner through the login form."""
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        base = f"http://127.0.0.1:{self.port}"
        login = opener.open(f"{base}/login", timeout=30).read().decode()
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)
        assert csrf is not None, login
        form = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf.group(1), "username": "me", "password": PASSWORD,
                                       "next": "/settings"}).encode()
        request = urllib.request.Request(f"{base}/login", data=form, headers={"Referer": f"{base}/login"})
        page = opener.open(request, timeout=30)
        assert page.geturl().endswith("/settings"), page.geturl()
        return str(page.read().decode())

    def wait_state(self, task_id: str, *states: str) -> dict[str, Any]:
        return dict(wait_for(lambda: (lambda t: t if t["state"] in states else None)(self.call("GET", f"/api/tasks/{task_id}")),
                             timeout=60, what=f"task {task_id} to be {' or '.join(states)}"))


@pytest.fixture
def ordinary_box() -> Iterator[OrdinaryBox]:
    data = Path(tempfile.mkdtemp(prefix="box-not-root-"))  # under /tmp: the user can reach it
    os.chown(data, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    hold = Path(tempfile.mkdtemp(prefix="box-not-root-python-"))
    try:
        yield OrdinaryBox(data, hold)
    finally:
        shutil.rmtree(data, ignore_errors=True)
        hold.rmdir()  # a mount point only inside the box's namespaces: empty here


def test_a_box_that_is_not_root_refuses_tasks_until_told_and_says_so_everywhere(ordinary_box: OrdinaryBox,
                                                                              tmp_path: Path) -> None:
    box = ordinary_box
    box.manage("migrate", "--no-input")
    box.manage("createowner", "me", BOX_OWNER_PASSWORD=PASSWORD)
    box.token = box.manage("createtoken", "--name", "test").strip().splitlines()[-1]
    marker = box.data / "ran"
    spec = {"title": "who am I", "prompt": "p", "worker": "command",
            "command": ["/bin/sh", "-c", f"id -u; touch {marker}"]}

    doctor = box.run("doctor")
    assert doctor.returncode != 0, doctor.stdout
    assert "FAIL sandbox: tasks are refused: the box cannot sandbox them (the box is not running as root" in doctor.stdout
    assert "fix: run the box as root (sudo), or set BOX_SANDBOX=off" in doctor.stdout
    doctor = box.run("doctor", BOX_SANDBOX="off")
    assert "ok   sandbox: off, as set (BOX_SANDBOX=off): tasks run as the box's own user (the sandbox would lack: " \
           "the box is not running as root" in doctor.stdout, doctor.stdout

    log = tmp_path / "refused.log"
    proc = box.start(log)
    try:
        assert "Sandbox: refused: tasks do not run, since the box cannot sandbox them (the box is not running as root" \
            in log.read_text()
        assert "To run tasks: run the box as root (sudo), or set BOX_SANDBOX=off" in log.read_text()
        isolation = box.call("GET", "/api/health")["isolation"]
        assert isolation["sandbox"] is False and isolation["mode"] == "refused", isolation
        assert "the box is not running as root" in isolation["missing"]
        assert "BOX_SANDBOX=off" in isolation["fix"]

        task = box.call("POST", "/api/tasks", spec)
        failed = box.wait_state(task["id"], "failed", "done")
        assert failed["state"] == "failed", failed
        assert failed["error"].startswith("not run: this box cannot sandbox tasks (the box is not running as root")
        assert "run the box as root" in failed["error"] and "set BOX_SANDBOX=off" in failed["error"]
        assert failed["recoverable"] is True
        events = box.call("GET", f"/api/tasks/{task['id']}/events")
        assert not [e for e in events["events"] if e["kind"] == "output"], events
        assert not marker.exists()  # nothing of the task ran

        page = box.settings_page()
        assert 'data-mode="refused"' in page and "Refused: tasks do not run" in page
        assert "<li>the box is not running as root</li>" in page
        assert "set BOX_SANDBOX=off" in page
    finally:
        stop(proc, grace=30)

    log = tmp_path / "off.log"
    proc = box.start(log, BOX_SANDBOX="off")
    try:
        assert "Sandbox: off by the owner (BOX_SANDBOX=off)" in log.read_text()
        assert box.call("GET", "/api/health")["isolation"]["mode"] == "off"
        assert 'data-mode="off"' in box.settings_page()
        box.call("POST", f"/api/tasks/{task['id']}/retry", {})
        done = box.wait_state(task["id"], "done", "failed")
        assert done["state"] == "done", done
        assert done["isolation"].startswith("not sandboxed: the sandbox is turned off (BOX_SANDBOX=off)")
        events = box.call("GET", f"/api/tasks/{task['id']}/events")
        said = [e["summary"] for e in events["events"] if e["kind"] == "output"]
        assert str(box.user.pw_uid) in said, events  # the box's own user: nothing pretends otherwise
        assert marker.exists()
    finally:
        stop(proc, grace=30)

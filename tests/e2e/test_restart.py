"""A restart of the box in a real browser: the task window (desktop and a phone-sized screen) of a
task cut off mid-step says "the box restarted; resuming step N" at once instead of a bare
"running", marks the step run again as a retry, and the task ends done."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import expect

from tasks.layers import paths
from tasks.models import Run, RunState
from tests.cluster import spawn, stop
from tests.conftest import database_env, wait_for
from tests.e2e.conftest import PHONE, create_owner, screenshot
from tests.e2e.test_evidence import no_sideways_scroll, sign_in
from tests.e2e.test_portal import new_task, task_row

pytestmark = pytest.mark.django_db(transaction=True)

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")
# The first try of step 2 hangs (it is the one the restart cuts off); the retry finishes at once.
STEPS = [
    {"name": "prepare", "write": {"path": "a.txt", "content": "a\n"}},
    {"name": "long", "run": "if [ -f .attempted ]; then echo again; else touch .attempted; sleep 60; fi"},
]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def kill_the_worker_cluster(run: Run) -> None:
    """Power cut for the worker side: the cluster this run's worker belongs to (its own session,
    as the box starts it) and the worker itself die at once, with no chance to hand anything back."""
    os.killpg(os.getpgid(run.worker_pid), signal.SIGKILL)
    try:
        os.kill(run.worker_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_for(lambda: _gone(run.worker_pid), timeout=10, what="the worker to be gone")


def box_env() -> dict[str, str]:
    env = database_env()
    # A lease far longer than the test: any narration seen comes from the restart, not the reaper.
    env.update({"BOX_QUEUE_POLL_S": "0.05", "BOX_WORKERS": "1", "BOX_LEASE_SECONDS": "300",
                "BOX_QUEUE_NAME": str(settings.Q_CLUSTER["name"])})
    return env


def scheduler_starts(env: dict[str, str]) -> None:
    """The box's scheduler coming back up: its start-up phases and one tick, then it exits."""
    done = subprocess.run([sys.executable, MANAGE, "runscheduler", "--once"], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_task_cut_off_by_a_restart_says_so_resumes_its_step_as_a_retry_and_ends_done(
        page: Any, browser: Any, live_box: Any, tmp_path: Path) -> None:
    create_owner(page)
    new_task(page, "Restarted", STEPS)
    task_row(page, "Restarted").get_by_role("link", name="Restarted").click()
    task_id = page.locator("#task-window").get_attribute("data-task")
    log = page.get_by_role("list", name="Action log")
    expect(log.get_by_text("step 2/2 run: long", exact=True)).to_be_visible(timeout=30_000)
    marks = [paths.layer_dir(task_id) / "upper" / ".attempted", paths.view_dir(task_id) / ".attempted"]
    wait_for(lambda: any(m.exists() for m in marks), timeout=30, what="the first try of step 2 to be under way")
    run = Run.objects.get(task_id=task_id, state=RunState.RUNNING)

    kill_the_worker_cluster(run)
    env = box_env()
    scheduler_starts(env)

    # At once, not after the lease: the header and the log say what happened, in plain words.
    expect(page.locator("#task-state")).to_have_text("running")
    expect(page.locator("#task-step")).to_have_text("the box restarted; resuming step 2")
    note = log.locator("li.kind-note").filter(has_text="the box restarted; resuming step 2")
    expect(note).to_be_visible()
    expect(log.locator("li.kind-note").filter(has_text="interrupted: step 2/2 run: long")).to_contain_text("runs again from its start")

    phone = browser.new_context(base_url=live_box.url, **PHONE)
    phone.set_default_timeout(20_000)
    small = phone.new_page()
    cluster = None
    try:
        sign_in(small)
        small.goto(page.url)
        expect(small.locator("#task-step")).to_have_text("the box restarted; resuming step 2")
        no_sideways_scroll(small)

        cluster = spawn([sys.executable, MANAGE, "runcluster"], env, tmp_path / "restarted-cluster.log")
        expect(page.locator("#task-state")).to_have_text("done", timeout=60_000)
        retried = log.locator("li.kind-step").filter(has_text="step 2/2 run: long (retry)")
        expect(retried).to_have_count(1)
        expect(retried.locator(".kind")).to_have_text("Retry")
        expect(log.locator("li.kind-step_result").filter(has_text="step 2/2 run")).to_have_count(1)
        assert not log.locator("li").filter(has_text="lease expired").count()
        screenshot(page, "task-window-restart")

        expect(small.locator("#task-state")).to_have_text("done", timeout=30_000)
        phone_log = small.get_by_role("list", name="Action log")
        expect(phone_log.locator("li.kind-note").filter(has_text="the box restarted; resuming step 2")).to_be_visible()
        expect(phone_log.locator("li.kind-step").filter(has_text="(retry)").locator(".kind")).to_have_text("Retry")
        no_sideways_scroll(small)
        screenshot(small, "phone-task-window-restart")
    finally:
        phone.close()
        if cluster is not None:
            stop(cluster, grace=4)

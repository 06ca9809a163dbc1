"""Browser tests: Chromium driven by Playwright against the real box — daphne serving the ASGI
application and a real django-q2 cluster executing runs — on the test database."""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import expect, sync_playwright

from boxsite.core import setup_code
from tasks.models import Workspace
from tasks.run import lifecycle
from tests.cluster import spawn, stop
from tests.conftest import database_env, free_port, wait_for

# Playwright's sync API keeps an asyncio loop running in the test thread; Django's guard against
# ORM calls from async code would then refuse the test database's own setup and flush. The tests
# themselves never touch the ORM while a page is in flight, so the guard is switched off here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PASSWORD = "correct horse battery"
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # These tests are not about a clean stop (the recovery tests are), so they wait for it briefly.
    stop(proc, grace=4)


class LiveBox:
    def __init__(self, url: str, home: Path, logs: Path) -> None:
        self.url = url
        self.home = home
        self.logs = logs


@pytest.fixture
def live_box(transactional_db: Any, tmp_path: Path) -> Iterator[LiveBox]:
    """The web process and a worker, as `runbox` starts them, sharing the test database."""

    home = tmp_path / "home"
    home.mkdir()
    (home / "README.md").write_text("# A project\n\nIt has a readme.\n")
    Workspace.objects.update_or_create(name="home", defaults={"base_dir": str(home)})
    port = free_port()
    env = database_env()
    env.update({
        "BOX_QUEUE_POLL_S": "0.05",
        "BOX_WORKERS": "1",
        "BOX_LIVE_POLL_SECONDS": "0.1",
        "BOX_QUEUE_NAME": str(settings.Q_CLUSTER["name"]),
        "BOX_ALLOWED_HOSTS": "127.0.0.1,localhost",
    })
    logs = tmp_path
    python = sys.executable
    manage = str(Path(settings.BASE_DIR) / "manage.py")
    procs = [
        spawn([python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "boxsite.asgi:application"], env, logs / "web.log"),
        spawn([python, manage, "runcluster"], env, logs / "cluster.log"),  # the worker process `runbox` starts
    ]
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(up, timeout=30, what="the web process to answer")
        yield LiveBox(url, home, logs)
    finally:
        for proc in procs:
            _stop(proc)
        # What the box's own stop does after its processes: a task left running or waiting gives
        # up its processes, user and mounts (its rows are flushed next), ended ones are released.
        lifecycle.janitor.drain()
        lifecycle.release_host()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module: sync Playwright keeps an event loop running in this thread
    while it is open, so it must close before a later module's asyncio tests run on this worker."""

    # The machine is shared by parallel suites; a live update may take a few seconds under load.
    expect.set_options(timeout=15_000)

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, live_box: LiveBox) -> Iterator[Any]:
    context = browser.new_context(base_url=live_box.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


def screenshot(page: Any, name: str) -> None:
    """Save a picture of a real page for the docs, when BOX_SCREENSHOTS_DIR asks for them. The
    passing status message ("Asked: ...") is left out: it would cover what the picture shows."""
    target = os.environ.get("BOX_SCREENSHOTS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True, style="#live-status { visibility: hidden; }")


def create_owner(page: Any, name: str = "owner") -> None:
    """The first visit: the box asks for the owner account."""
    code = setup_code.issue()  # what `runbox` prints at its start (the web process shares the data dir)
    page.goto("/")
    page.get_by_role("heading", name="Create the owner account").wait_for()
    page.get_by_label("Setup code").fill(code)
    page.get_by_label("Name").fill(name)
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password again").fill(PASSWORD)
    page.get_by_role("button", name="Create the owner account").click()
    page.get_by_role("heading", name="Tasks", exact=True).wait_for()

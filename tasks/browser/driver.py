"""The worker process's one Playwright driver, shared by every browser session it runs.

Playwright's driver is a Node.js process of its own whose start costs about as much as starting
Chromium; started once per worker process (at its first browser step) and kept, a task's browser
start is Chromium's and the CDP attach alone. Playwright's sync API lives in the thread that
started it, so every Playwright call of every session runs on this module's one thread
(``call``). That thread keeps an event loop running, so Django refuses it the database: what a
session does with the database, it does on its own thread (``BrowserSession``).

A worker runs one run at a time; two sessions in one process (a test's) take turns on the thread.
The driver is started again when it died.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from playwright.sync_api import Playwright, sync_playwright

log = logging.getLogger(__name__)

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_playwright: Playwright | None = None


def _thread() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="box-browser-driver")
        return _executor


def submit(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on the driver's thread."""
    return _thread().submit(fn)


def call(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the driver's thread; its result or exception."""
    return submit(fn).result()


def warm() -> None:
    """Start the driver in the background (a session calls it as Chromium starts, so the two
    start-ups overlap when the driver is not running yet)."""
    submit(playwright)


def playwright() -> Playwright:
    """The running driver, started on first use or when it died; on the driver's thread only."""
    global _playwright
    if _playwright is not None and not _alive(_playwright):
        log.warning("the Playwright driver exited; starting it again")
        with contextlib.suppress(Exception):
            _playwright.stop()  # ends its event loop in this thread, which a new start needs
        _playwright = None
    if _playwright is None:
        _playwright = sync_playwright().start()
    return _playwright


def _alive(running: Playwright) -> bool:
    # The driver's process, as Playwright's pipe transport holds it; a version that keeps it
    # elsewhere counts as alive (a dead one then fails the session's connect).
    transport = getattr(getattr(running._impl_obj, "_connection", None), "_transport", None)
    proc = getattr(transport, "_proc", None)
    return proc is None or proc.returncode is None

"""A task's browser: Chromium started as the task's own process, driven by Playwright.

Chromium starts through the one launcher every task process uses (``tasks.sandbox.launcher``):
with the sandbox it runs as the task's user in its namespaces, reaching only the task's hosts
through the in-namespace proxy (``--proxy-server``, with loopback not bypassed); without it, it
runs as the box's user with the same proxy. Its profile lives in a private temporary directory,
never in the task's files, unless the task keeps one (``constraints.browser_profile``: the
owner's folder, mounted for it and locked for one browser at a time). Playwright connects over CDP (``relay`` explains how the worker reaches
a port inside the namespace). One session lives across the steps of one run and is closed when
the run ends, except at a pause (``park``): then Chromium stays, with the page as it was, kept
by the process that started it (``kept``: closed after an idle limit), a person may see and
drive it (``screencast``), and the task's next run attaches to it (``attach``) from whichever
worker process runs it. ``tasks.sandbox.release`` kills whatever is left of it when the task ends.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from django.db import connection
from playwright.sync_api import Browser, BrowserContext, Page, Playwright

from tasks.browser import driver, kept, origins
from tasks.browser.binary import executable, missing_reason
from tasks.browser.relay import DevtoolsRelay
from tasks.run.evidence import StepFailed
from tasks.sandbox import launcher, paths, support

if TYPE_CHECKING:
    from tasks.run.context import RunContext

log = logging.getLogger(__name__)

DEVTOOLS_PORT = 9222  # inside the task's own network namespace
START_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 20.0
_LISTENING = re.compile(r"DevTools listening on (ws://[^/\s]+(/devtools/browser/[0-9a-f-]+))")
WINDOW = (1280, 900)
# A closed port: without hosts a browser outside the sandbox must not reach anything directly.
_NOWHERE = "http://127.0.0.1:9"

_SCRIPT = """\
set -e
home="$BOX_BROWSER_HOME"
mkdir -p "$home/profile" "$home/config" "$home/cache"
export HOME="$home" XDG_CONFIG_HOME="$home/config" XDG_CACHE_HOME="$home/cache"
exec "$BOX_BROWSER" --headless --no-sandbox --disable-dev-shm-usage --disable-gpu \\
  --no-first-run --no-default-browser-check --disable-extensions --disable-sync \\
  --disable-background-networking --disable-component-update --mute-audio \\
  --disable-default-apps --disable-domain-reliability --disable-client-side-phishing-detection \\
  --disable-field-trial-config --metrics-recording-only --no-pings --disable-breakpad \\
  --disable-component-extensions-with-background-pages --no-service-autorun --disable-search-engine-choice-screen \\
  --disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication,CertificateTransparencyComponentUpdater,NetworkTimeServiceQuerying,LensOverlay,HttpsUpgrades \\
  --password-store=basic --use-mock-keychain \\
  --user-data-dir="${{BOX_BROWSER_PROFILE:-$home/profile}}" --window-size={width},{height} \\
  --proxy-server="${{HTTP_PROXY:-{nowhere}}}" --proxy-bypass-list="<-loopback>" \\
  --remote-debugging-address=127.0.0.1 --remote-debugging-port={port} about:blank
"""


T = TypeVar("T")

# The parked browsers this process started, by task: each keeps its session thread (Chromium's
# parent thread: its death would kill Chromium, ``launcher.DIE_WITH_WORKER``) until Chromium exits.
_KEPT: dict[str, BrowserSession] = {}
_KEPT_LOCK = threading.Lock()


class BrowserSession:
    """Chromium for one run of one task, and the Playwright objects that drive it.

    Playwright's sync API keeps an event loop running in the thread that uses it, where Django
    refuses database calls; so every Playwright call happens on the driver's thread (``call``,
    ``tasks.browser.driver``: one driver per worker process, kept across runs), and the worker's
    thread keeps the database. Chromium is started from the session's own thread (the
    launcher's queries, whose connection ``_start`` closes), which stays its parent. What the browser thread learns for
    the log (a page refused by ``origins``) waits in ``blocked`` until the worker records it.
    """

    def __init__(self, ctx: RunContext) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"box-browser-{ctx.task.pk}")
        self.blocked: list[dict[str, Any]] = []
        self.ctx = ctx
        self.proc: subprocess.Popen[bytes] | None = None
        self.relay: DevtoolsRelay | None = None
        self.playwright: Playwright | None = None
        self.browser: Browser | None = None
        self.context: BrowserContext | None = None
        self._page: Page | None = None
        self._home: str | None = None
        self._output: deque[str] = deque(maxlen=200)
        self.started_ms = 0
        self._closed = threading.Event()
        self._parked = threading.Event()
        self._devtools: tuple[str, str] | None = None  # the DevTools URL and path Chromium printed
        self.attached: dict[str, Any] | None = None  # the parked browser this run attached to
        self.last_shot: Any = None  # the last acting step's after-image (tasks.browser.steps.Shot)
        self._profile_lock = -1  # the lock on constraints.browser_profile while Chromium runs

    @property
    def started(self) -> bool:
        return self.proc is not None or self.attached is not None

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the session's thread (where Playwright lives); its result or exception."""
        return driver.call(fn)

    def take_blocked(self) -> list[dict[str, Any]]:
        taken, self.blocked = self.blocked, []
        return taken

    # -- life -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.submit(self._start).result()

    def _start(self) -> None:
        reason = missing_reason()
        if reason is not None:
            raise StepFailed(f"the box cannot run browser steps: {reason}")
        clock = time.monotonic()
        sandboxed = support.available()
        if sandboxed:
            home = "/tmp/box-browser"  # the task's private /tmp inside its own root
            port = DEVTOOLS_PORT
        else:
            self._home = tempfile.mkdtemp(prefix="box-browser-")
            home, port = self._home, 0
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
            "BOX_BROWSER_HOME": home, "BOX_BROWSER": executable(), "BOX_TASK_ID": self.ctx.task.pk,
        }
        profile = self._take_profile()
        if profile is not None:
            env["BOX_BROWSER_PROFILE"] = launcher.PROFILE_MOUNT if sandboxed else str(profile)
        script = _SCRIPT.format(width=WINDOW[0], height=WINDOW[1], nowhere=_NOWHERE, port=port)
        try:
            self.proc = launcher.popen(self.ctx, ["/bin/sh"], env=env, cwd=self.ctx.workdir, script=script, profile=profile)
        except OSError as exc:
            self._let_go_of_profile()
            raise StepFailed(f"the browser did not start: {exc}") from exc
        finally:
            # The launcher's check (has the task ended meanwhile?) opened this thread's own
            # connection. Nothing else closes it: the thread outlives the run while its browser
            # is parked, and a wrapper of a thread that ended holds its backend until a full
            # garbage collection. Closed now.
            connection.close()
        try:
            devtools = self._read_output()
            # Playwright's driver (a process of its own), when not running yet, starts while
            # Chromium does: the two start-ups overlap instead of adding up.
            driver.warm()
            url, path = devtools()
            self._devtools = (url, path)
            if sandboxed:
                self.relay = DevtoolsRelay(self.proc.pid, DEVTOOLS_PORT, path)
                url = self.relay.url
            self.call(lambda: self._connect(url))
        except BaseException:
            self.call(self._close)
            raise
        self.started_ms = int((time.monotonic() - clock) * 1000)
        threading.Thread(target=self._stop_when_the_run_stops, name="box-browser-stop", daemon=True).start()

    def _connect(self, url: str) -> None:
        self.playwright = driver.playwright()
        self.browser = self.playwright.chromium.connect_over_cdp(url, timeout=START_TIMEOUT_S * 1000)
        self.context = self.browser.contexts[0] if self.browser.contexts else self.browser.new_context()
        self.context.set_default_timeout(15_000)
        # A page's service worker would fetch and answer on its own, out of this session's sight.
        self.context.add_init_script(_NO_SERVICE_WORKERS)
        if origins.allowed_list(self.ctx.task.constraints):
            self._guard_origins(self.browser)
        self._page = self.context.pages[0] if self.context.pages else self.context.new_page()

    # -- parking across a pause ----------------------------------------------------------------
    def park(self) -> None:
        """Keep Chromium, and the page as it is, for the task's next run: Playwright lets go of
        it, and the process that started it keeps it until it exits (killed by the task's
        release at cancel or any final state, or by a later run that does not park it again)."""
        if not self.alive and self.attached is None:
            self.close()
            return
        self._parked.set()
        try:
            driver.submit(self._let_go).result(timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a browser Playwright cannot let go of is not kept
            log.warning("parking task %s's browser failed", self.ctx.task.pk, exc_info=True)
            self._parked.clear()
            self.close()
            return
        if self.attached is not None:  # kept by the process that started it; its record stands
            kept.touch(self.ctx.task.pk)  # idle from now on, not from the pause before
            self._thread.shutdown(wait=False)
            return
        assert self.proc is not None and self._devtools is not None
        proc = self.proc
        record = {"pid": proc.pid, "start": start_time(proc.pid), "url": self._devtools[0], "path": self._devtools[1],
                  "pidns": _children_pid_namespace(proc.pid) if support.available() else None}
        write_record(self.ctx.task.pk, record)
        with _KEPT_LOCK:
            _KEPT[self.ctx.task.pk] = self
        threading.Thread(target=self._keep, args=(proc,), name=f"box-browser-kept-{self.ctx.task.pk}", daemon=True).start()

    def _let_go(self) -> None:
        browser, self.browser = self.browser, None
        if browser is not None:
            browser.close()  # over CDP: Playwright lets go of Chromium, which runs on
        self._stop_playwright()
        self.context = self._page = None
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def _keep(self, proc: subprocess.Popen[bytes]) -> None:
        """Until the parked Chromium exits (or sits idle too long, ``kept.watch``); then what
        held it goes too."""
        task_id = self.ctx.task.pk
        kept.watch(task_id, proc)
        with _KEPT_LOCK:
            if _KEPT.get(task_id) is self:
                del _KEPT[task_id]
        record = read_record(task_id)
        if record is not None and record.get("pid") == proc.pid:
            remove_record(task_id)
        self.proc = None
        self._let_go_of_profile()
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None
        self._thread.shutdown(wait=False)

    def attach(self) -> bool:
        """Attach to the browser an earlier run of the task parked; False when there is none
        alive (the process that kept it is gone, the box restarted), and the record is dropped."""
        record = read_record(self.ctx.task.pk)
        if record is None:
            return False
        if not _same_process(record):
            remove_record(self.ctx.task.pk)
            return False
        kept.touch(self.ctx.task.pk)  # a run holds it now: not idle
        try:
            self.call(lambda: self._attach(record))
        except Exception:  # noqa: BLE001 - not there any more: the caller starts a fresh one
            log.warning("attaching to task %s's kept browser failed", self.ctx.task.pk, exc_info=True)
            self.call(self._close)
            kill_parked(self.ctx.task.pk)
            return False
        threading.Thread(target=self._stop_when_the_run_stops, name="box-browser-stop", daemon=True).start()
        return True

    def _attach(self, record: dict[str, Any]) -> None:
        self.attached = record
        url = str(record["url"])
        if record.get("pidns") is not None:
            self.relay = DevtoolsRelay(int(record["pid"]), DEVTOOLS_PORT, str(record["path"]))
            url = self.relay.url
        self._connect(url)

    def _take_profile(self) -> Path | None:
        """The task's ``constraints.browser_profile``, locked for this browser alone (Chromium
        runs one browser per profile); a profile another task's browser holds fails the step."""
        folder = self.ctx.task.constraints.get("browser_profile")
        if not folder:
            return None
        profile = Path(str(folder))
        if not profile.is_dir():
            raise StepFailed(f"the browser profile folder {profile} is gone")
        locks = paths.data_dir() / "browser-profiles"
        locks.mkdir(mode=0o700, exist_ok=True)
        name = hashlib.sha256(str(profile).encode()).hexdigest()[:32]
        fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another task"
            os.close(fd)
            raise StepFailed(f"the browser profile {profile} is in use by task {holder}'s browser: one browser at a "
                             "time per profile; run this task again once that one has ended") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, self.ctx.task.pk.encode(), 0)
        self._profile_lock = fd
        # Chromium's own lock names the host and pid of its last user; in a fresh namespace that
        # reads as another computer's browser. The box's lock above is the one that counts.
        for stale in ("SingletonLock", "SingletonSocket", "SingletonCookie"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(profile / stale)
        return profile

    def _let_go_of_profile(self) -> None:
        fd, self._profile_lock = self._profile_lock, -1
        if fd >= 0:
            os.close(fd)  # releases the flock

    def _read_output(self) -> Callable[[], tuple[str, str]]:
        """Drain Chromium's output from now on; returns the wait for its DevTools address."""
        assert self.proc is not None and self.proc.stderr is not None and self.proc.stdout is not None
        found: list[tuple[str, str]] = []
        ready = threading.Event()

        def read(stream: IO[bytes], look: bool) -> None:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip()
                self._output.append(line)
                match = _LISTENING.search(line) if look and not found else None
                if match:
                    found.append((match.group(1), match.group(2)))
                    ready.set()
            ready.set()  # the stream closed: the browser is gone
            stream.close()

        threading.Thread(target=read, args=(self.proc.stderr, True), daemon=True).start()
        threading.Thread(target=read, args=(self.proc.stdout, False), daemon=True).start()

        def wait() -> tuple[str, str]:
            if not ready.wait(START_TIMEOUT_S) or not found:
                tail = "; ".join(line for line in list(self._output)[-5:] if line)
                raise StepFailed(f"the browser did not start{': ' + tail if tail else ''}")
            return found[0]

        return wait

    def close(self) -> None:
        """Release everything; safe to call twice and after a failed start. Chromium is killed
        even when Playwright's thread is stuck in a call."""
        self._closed.set()
        try:
            driver.submit(self._close).result(timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001, S110 - killing the browser below is what matters
            pass
        finally:
            self._kill()
            self._thread.shutdown(wait=False)

    def _stop_when_the_run_stops(self) -> None:
        """A run that lost its lease (``ctx.stop``) must not act on: kill the browser, so a step
        waiting on the page ends at once instead of at its timeout."""
        while not (self._closed.is_set() or self._parked.is_set()):
            if self.ctx.stop.wait(0.5):
                if not self._parked.is_set():
                    self._kill()
                return

    def _close(self) -> None:
        for step in (self._close_browser, self._stop_playwright, self._kill):
            try:
                step()
            except Exception:  # noqa: BLE001 - the next step must still run; the failure is logged
                log.warning("closing task %s's browser: %s failed", self.ctx.task.pk, step.__name__, exc_info=True)
        if self.relay is not None:
            self.relay.stop()
            self.relay = None
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def _close_browser(self) -> None:
        if self.browser is None:
            return
        browser, self.browser = self.browser, None
        if self._profile_lock >= 0 and self.proc is not None:
            # A kept profile: Chromium shuts down by itself, writing cookies and storage to it
            # (a kill could lose what the last seconds changed).
            browser.new_browser_cdp_session().send("Browser.close")
            self.proc.wait(timeout=CLOSE_TIMEOUT_S / 2)
            return
        browser.close()

    def _stop_playwright(self) -> None:
        self.playwright = None  # the driver is the process's, kept for its next session

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            launcher.kill(proc)
            proc.wait(timeout=10)
            self._let_go_of_profile()
        if self.attached is not None:
            self.attached = None
            kill_parked(self.ctx.task.pk)

    # -- use --------------------------------------------------------------------------------
    @property
    def page(self) -> Page:
        if self._page is None:
            self.start()
        assert self._page is not None
        if self._page.is_closed():
            assert self.context is not None
            self._page = self.context.pages[-1] if self.context.pages else self.context.new_page()
        return self._page

    def use_page(self, page: Page) -> None:
        """The steps from now on act on ``page`` (a tab the page opened, or one a step chose)."""
        self._page = page
        page.bring_to_front()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _guard_origins(self, browser: Browser) -> None:
        """Hold every document request of the whole browser (each page, popup and frame, and each
        hop of a redirect) to ``constraints.origins``. DevTools' Fetch domain on the browser target
        pauses them before they are sent; unlike Playwright's routing it leaves the HTTP cache on
        and sees redirect hops."""
        cdp = browser.new_browser_cdp_session()

        def paused(event: dict[str, Any]) -> None:
            url = str(event["request"]["url"])
            if origins.allowed(url, self.ctx.task.constraints):
                cdp.send("Fetch.continueRequest", {"requestId": event["requestId"]})
                return
            self.blocked.append({"url": url[:500], "origin": origins.origin_of(url), "reason": "not in constraints.origins",
                                 "via": "browser", **({"redirect": True} if event.get("redirectedRequestId") else {})})
            cdp.send("Fetch.failRequest", {"requestId": event["requestId"], "errorReason": "BlockedByClient"})

        cdp.on("Fetch.requestPaused", paused)
        cdp.send("Fetch.enable", {"patterns": [{"urlPattern": "*", "resourceType": "Document", "requestStage": "Request"}]})


_NO_SERVICE_WORKERS = """(() => {
    try { delete Navigator.prototype.serviceWorker; } catch (e) {}
})();"""


# -- the record of a parked browser ---------------------------------------------------------------
# A root-only file in the task's runtime directory (removed with it at the task's release): the
# process group to kill, its start time (so a recycled pid is never taken for it), the DevTools
# URL and path, and the PID namespace its processes live in (``tasks.sandbox.prepare`` spares it).
def _record_path(task_id: str) -> str:
    return str(paths.kept_browser(task_id))


def write_record(task_id: str, record: dict[str, Any]) -> None:
    paths.ensure_runtime_dir(task_id)
    target = _record_path(task_id)
    fd = os.open(f"{target}.new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle)
    os.replace(f"{target}.new", target)


def read_record(task_id: str) -> dict[str, Any] | None:
    try:
        with open(_record_path(task_id)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def remove_record(task_id: str) -> None:
    try:
        os.unlink(_record_path(task_id))
    except FileNotFoundError:
        pass


def kill_parked(task_id: str) -> None:
    """Kill the browser the task's record names (its whole PID namespace), if it is still that
    process, and drop the record."""
    record = read_record(task_id)
    remove_record(task_id)
    if record is not None and _same_process(record):
        try:
            os.killpg(int(record["pid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _same_process(record: dict[str, Any]) -> bool:
    pid = record.get("pid")
    return isinstance(pid, int) and record.get("start") is not None and start_time(pid) == record.get("start")


def _children_pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid_for_children")
    except OSError:
        return None

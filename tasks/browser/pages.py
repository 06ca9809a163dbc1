"""What a browser step meets beyond one element of the main frame: the frame its target is in,
the options of a list box, and what the page does while the step acts — a dialog, a new tab,
a download.

- Dialogs (alert, confirm, prompt, beforeunload) are never left to Playwright's silent default.
  A step that says ``dialog`` answers every dialog the page opens while it acts that way
  (``accept``, ``dismiss``, or ``{"accept": text}`` for a prompt). Any other dialog is
  unexpected: it is dismissed (cancel is the answer that changes nothing), listed in the step's
  evidence and noted in the log; the step goes on.
- A tab or popup the page opens while a step acts becomes the page the next steps act on; a
  ``tab`` step goes back (``tasks.browser.actions``).
- A download is saved by Chromium itself into ``.box-downloads`` of the task's copy (DevTools'
  ``Browser.setDownloadBehavior``: Chromium may run in the task's sandbox, where only the copy is
  shared with the box), then moved to ``downloads/<name>`` there, its name made safe, its size
  held to the task's ``disk_mb`` (or ``MAX_DOWNLOAD_BYTES``), and kept as an artifact too.

Everything here runs on the session's thread (``BrowserSession.call``): no database.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import time
import unicodedata
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playwright.sync_api import BrowserContext, CDPSession, Dialog, Frame, FrameLocator, Locator, Page
from playwright.sync_api import Error as PlaywrightError

from tasks.run import artifacts
from tasks.run.evidence import StepFailed
from tasks.sandbox import paths, support
from tasks.workers.file_steps import give_to_task_user

if TYPE_CHECKING:
    from tasks.browser.session import BrowserSession

MAX_DOWNLOAD_BYTES = 256 * 1024 * 1024
STAGING = ".box-downloads"
DOWNLOADS = "downloads"
_POLL_MS = 100
_DOWNLOAD_GRACE_S = 2.0


# -- frames --------------------------------------------------------------------------------------
def root_for(page: Page, spec: Any, timeout_ms: float) -> Page | Frame | FrameLocator:
    """Where a target is looked for: the page, or the frame its ``frame`` key names (the selector
    of the ``<iframe>``, or ``{"url": part of the frame's address}``)."""
    frame = spec.get("frame") if isinstance(spec, dict) else None
    if frame is None:
        return page
    if isinstance(frame, dict) and "url" in frame:
        return _frame_by_url(page, str(frame["url"]), timeout_ms)
    selector = frame["selector"] if isinstance(frame, dict) else frame
    return page.frame_locator(str(selector)).first


def _frame_by_url(page: Page, part: str, timeout_ms: float) -> Frame:
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        for frame in page.frames:
            if frame is not page.main_frame and part in frame.url:
                return frame
        left = deadline - time.monotonic()
        if left <= 0:
            raise StepFailed(f"no frame of the page has {part!r} in its address")
        try:
            page.wait_for_event("framenavigated", timeout=min(left * 1000, 1000))
        except PlaywrightError:
            continue  # none navigated meanwhile: look again until the deadline


# -- list boxes ----------------------------------------------------------------------------------
def choose_options(select: Locator, wanted: list[str], timeout_ms: float) -> list[str]:
    """Select the options of ``select`` named by label (first) or value; the labels chosen.
    One that is not there fails the step, naming the options there are."""
    options: list[dict[str, Any]] = select.evaluate(
        "e => Array.from(e.options || []).map((o, i) => ({index: i, label: (o.label || o.text).trim(), value: o.value}))")
    indexes: list[int] = []
    for name in wanted:
        found = next((o for o in options if o["label"] == name), None) or next((o for o in options if o["value"] == name), None)
        if found is None:
            shown = ", ".join(repr(o["label"]) for o in options[:30]) or "none"
            raise StepFailed(f"the list box has no option {name!r} (its options: {shown})")
        indexes.append(int(found["index"]))
    if len(indexes) > 1 and not select.evaluate("e => e.multiple"):
        raise StepFailed(f"the list box takes one option, not {len(indexes)}")
    select.select_option(index=indexes, timeout=timeout_ms)
    return [next(o["label"] for o in options if o["index"] == i) for i in indexes]


# -- what the page does while a step acts -----------------------------------------------------------
@dataclass
class Watch:
    """The watchers on one session's browser (re-installed when a run attaches to a kept one)."""

    session: BrowserSession
    context: BrowserContext | None = None
    cdp: CDPSession | None = None
    answer: Any = None  # the ``dialog`` of the step acting now; None: every dialog is unexpected
    acting: bool = False
    dialogs: list[dict[str, Any]] = field(default_factory=list)  # met by the step acting now
    to_note: list[dict[str, Any]] = field(default_factory=list)  # unexpected ones the log has not said yet
    opened: list[Page] = field(default_factory=list)
    downloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[Page] = field(default_factory=list)  # the pages acted on before, newest last
    limit: int = MAX_DOWNLOAD_BYTES
    staging: Path | None = None  # the copy's staging folder, there while a step acts
    navigating: set[Any] = field(default_factory=set)  # navigations the acting step started, not yet ended
    aborted: float | None = None  # when a navigation of the acting step was aborted (a download's is)

    def install(self) -> None:
        context = self.session.context
        if context is None or context is self.context:
            return
        self.context = context
        for page in context.pages:
            page.on("dialog", self._dialog)
        context.on("page", self._page)
        context.on("request", self._request)
        context.on("requestfinished", self._request_ended)
        context.on("requestfailed", self._request_ended)
        self.cdp = None
        self.downloads.clear()
        self.navigating.clear()

    def _request(self, request: Any) -> None:
        if self.acting and request.is_navigation_request():
            self.navigating.add(request)

    def _request_ended(self, request: Any) -> None:
        if request in self.navigating and "ERR_ABORTED" in str(request.failure or ""):
            self.aborted = time.monotonic()
        self.navigating.discard(request)

    def _pages_pending(self) -> bool:
        """Has the browser a page Playwright has not announced yet (a popup still attaching)?"""
        if self.cdp is None or self.context is None:
            return False
        try:
            targets = self.cdp.send("Target.getTargets")["targetInfos"]
        except PlaywrightError:
            return False
        return sum(1 for t in targets if t.get("type") == "page") > len(self.context.pages)

    def _let_arrive(self, page: Page, deadline: float) -> None:
        """What the action set going arrives before the step looks for it: a navigation it
        started ends (a download begins as its response comes) and a popup is announced. Waits
        on events, to the step's deadline."""
        while (self.navigating or self._pages_pending() or self._download_due()) and time.monotonic() < deadline:
            page.wait_for_timeout(_POLL_MS)  # DevTools events arrive while Playwright waits

    def _download_due(self) -> bool:
        """A navigation the step started was aborted, as a download's is, and no download has
        been announced yet: the browser's event and the page's come on separate channels."""
        return self.aborted is not None and not self.downloads and time.monotonic() - self.aborted < _DOWNLOAD_GRACE_S

    def _page(self, page: Page) -> None:
        page.on("dialog", self._dialog)
        if self.acting:
            self.opened.append(page)

    def _dialog(self, dialog: Dialog) -> None:
        seen: dict[str, Any] = {"type": dialog.type, "message": dialog.message[:500]}
        answer = self.answer
        try:
            if answer is None:
                dialog.dismiss()
                seen.update(answer="dismissed", unexpected=True)
            elif answer == "dismiss":
                dialog.dismiss()
                seen["answer"] = "dismissed"
            else:
                text = answer.get("accept") if isinstance(answer, dict) else None
                if dialog.type == "prompt" and text is not None:
                    dialog.accept(str(text))
                else:
                    dialog.accept()
                seen["answer"] = "accepted"
        except PlaywrightError as exc:  # the page went away with its dialog: say so, do not stop the step
            seen["answer"] = f"gone before it was answered ({exc.message[:120]})"
        self.dialogs.append(seen)
        if seen.get("unexpected"):
            self.to_note.append(seen)

    # -- downloads --------------------------------------------------------------------------
    def _downloads_ready(self, ctx: Any) -> None:
        """Chromium saves downloads into the copy's staging folder, and says so over DevTools."""
        staging = Path(ctx.workdir) / STAGING
        if not staging.is_dir():
            if staging.is_symlink() or staging.exists():
                raise StepFailed(f"'{STAGING}' in the task's files is not a folder the box made; remove it")
            try:
                staging.mkdir()
            except OSError:
                return  # a copy that takes no folder now takes no download either: one fails its step
            give_to_task_user(Path(ctx.workdir), [staging])
        self.staging = staging
        if self.cdp is not None:
            return
        browser = self.session.browser
        if browser is None:
            return
        inner = paths.view_mount(ctx.task.pk) / STAGING if support.available() else staging
        cdp = browser.new_browser_cdp_session()
        cdp.on("Browser.downloadWillBegin", self._will_begin)
        cdp.on("Browser.downloadProgress", self._progress)
        cdp.send("Browser.setDownloadBehavior", {"behavior": "allowAndName", "downloadPath": str(inner), "eventsEnabled": True})
        self.cdp = cdp

    def _will_begin(self, event: dict[str, Any]) -> None:
        self.downloads[str(event["guid"])] = {"url": str(event.get("url", ""))[:500],
                                              "suggested": str(event.get("suggestedFilename") or ""), "state": "inProgress"}

    def _progress(self, event: dict[str, Any]) -> None:
        entry = self.downloads.setdefault(str(event["guid"]), {"url": "", "suggested": "", "state": "inProgress"})
        if entry["state"] == "too big":
            return  # cancelled by the box for its size: that, not "canceled", is what the step says
        entry["state"] = str(event.get("state", "inProgress"))
        entry["bytes"] = int(event.get("receivedBytes") or 0)
        total = int(event.get("totalBytes") or 0)
        if entry["state"] == "inProgress" and max(total, entry["bytes"]) > self.limit and self.cdp is not None:
            entry["state"] = "too big"
            try:
                self.cdp.send("Browser.cancelDownload", {"guid": str(event["guid"])})
            except PlaywrightError:
                pass  # already ended: its file is refused when it is saved

    def _save_downloads(self, ctx: Any, page: Page, deadline: float, prefix: str) -> list[dict[str, Any]]:
        """Wait (to the step's deadline) for the downloads this step started; move each into
        ``downloads/`` of the copy and keep it as an artifact. The step fails for one too big,
        cancelled or unfinished."""
        while any(d["state"] == "inProgress" for d in self.downloads.values()) and time.monotonic() < deadline:
            page.wait_for_timeout(_POLL_MS)  # DevTools events arrive while Playwright waits
        saved: list[dict[str, Any]] = []
        staging = Path(ctx.workdir) / STAGING
        problems: list[str] = []
        for guid, entry in list(self.downloads.items()):
            del self.downloads[guid]
            name = safe_name(entry["suggested"] or entry["url"].rsplit("/", 1)[-1])
            staged = staging / guid
            if entry["state"] != "completed":
                _remove(staged)
                why = {"too big": f"is larger than the task's limit of {self.limit} bytes", "inProgress": "did not finish in time",
                       "canceled": "was cancelled"}.get(entry["state"], entry["state"])
                problems.append(f"the download of '{name}' {why}")
                continue
            saved.append(_keep(ctx, staged, name, self.limit, problems, prefix))
        if problems:
            raise StepFailed("; ".join(problems))
        return [s for s in saved if s]

    # -- one action ----------------------------------------------------------------------------
    def before(self, ctx: Any, answer: Any) -> None:
        """A step is about to act: how it answers dialogs; downloads and new pages are its own."""
        self.install()
        self.answer = answer
        self.acting = True
        self.dialogs = []
        self.opened = []
        self.navigating.clear()
        self.aborted = None
        disk_mb = ctx.task.limit("disk_mb")
        self.limit = min(MAX_DOWNLOAD_BYTES, disk_mb * 1024 * 1024) if disk_mb else MAX_DOWNLOAD_BYTES
        self._downloads_ready(ctx)

    def after(self, ctx: Any, timeout_ms: float, prefix: str) -> dict[str, Any]:
        """The step acted: a new tab becomes the page; its downloads are saved. What the step
        met, for its evidence."""
        deadline = time.monotonic() + timeout_ms / 1000
        met: dict[str, Any] = {}
        try:
            page = self.session.page
            self._let_arrive(page, deadline)
            opened = [p for p in self.opened if not p.is_closed()]
            if opened:
                self.history.append(page)
                page = opened[-1]
                self.session.use_page(page)
                try:
                    page.wait_for_load_state("load", timeout=max(1.0, (deadline - time.monotonic()) * 1000))
                except PlaywrightError:
                    pass  # still loading: the next step waits for what it needs
                met["tab"] = {"opened": page.url[:500], "tabs": len(page.context.pages)}
            saved = self._save_downloads(ctx, page, deadline, prefix) if self.downloads else []
            if saved:
                met["downloads"] = saved
        finally:
            met.update(self.stop())
        return met

    def stop(self) -> dict[str, Any]:
        """The step ended (failed, or stopped by a guard): what it met, and no answer for the
        dialogs from now on."""
        self.acting = False
        self.answer = None
        self._tidy()
        return {"dialogs": list(self.dialogs)} if self.dialogs else {}

    def _tidy(self) -> None:
        """The staging folder goes once empty: the task's files show only what it downloaded."""
        staging, self.staging = self.staging, None
        if staging is None or self.downloads:
            return
        try:
            staging.rmdir()
        except OSError:
            pass  # not empty (a download still arriving) or gone: the next step tidies it

    def unexpected(self) -> list[dict[str, Any]]:
        """The dialogs dismissed because no step said how to answer them, since the last ask."""
        found, self.to_note = self.to_note, []
        return found


_WATCHES: weakref.WeakKeyDictionary[BrowserSession, Watch] = weakref.WeakKeyDictionary()


def watch(session: BrowserSession) -> Watch:
    """The session's watchers, installed on its browser as it is now (on the session's thread)."""
    found = watch_of(session)
    found.install()
    return found


def watch_of(session: BrowserSession) -> Watch:
    """The session's watchers as they are, from any thread."""
    found = _WATCHES.get(session)
    if found is None:
        found = _WATCHES[session] = Watch(session)
    return found


# -- saving a download -----------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._ ()+-]+")


def safe_name(name: str) -> str:
    """A file name that stays one plain file in ``downloads/``: no folders, no leading dot, no
    control characters, at most 120 characters, its extension kept."""
    name = unicodedata.normalize("NFKC", name).replace("\\", "/").rsplit("/", 1)[-1]
    name = _UNSAFE.sub("_", name).strip(" ._") or "download"
    stem, dot, ext = name.rpartition(".")
    if dot and len(ext) <= 16 and stem:
        return f"{stem[:120 - len(ext) - 1]}.{ext}"
    return name[:120]


def _keep(ctx: Any, staged: Path, name: str, limit: int, problems: list[str], prefix: str) -> dict[str, Any]:
    try:
        st = os.lstat(staged)
    except FileNotFoundError:
        problems.append(f"the download of '{name}' left no file")
        return {}
    if not stat.S_ISREG(st.st_mode):
        _remove(staged)
        problems.append(f"the download of '{name}' is not a plain file")
        return {}
    if st.st_size > limit:
        _remove(staged)
        problems.append(f"the download of '{name}' is larger than the task's limit of {limit} bytes")
        return {}
    workdir = Path(ctx.workdir)
    folder = workdir / DOWNLOADS
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        _remove(staged)
        problems.append(f"'{DOWNLOADS}' in the task's files is not a folder")
        return {}
    if not folder.exists():
        folder.mkdir()
        give_to_task_user(workdir, [folder])
    target = folder / name
    stem, dot, ext = name.rpartition(".")
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = folder / (f"{stem}-{n}.{ext}" if dot and stem else f"{name}-{n}")
    os.rename(staged, target)
    kept: dict[str, Any] = {"file": f"{DOWNLOADS}/{target.name}", "bytes": st.st_size}
    if st.st_size <= artifacts.MAX_ARTIFACT_BYTES:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(artifacts.MAX_ARTIFACT_BYTES + 1)
        artifact = re.sub(r"[^A-Za-z0-9._-]+", "_", target.name)[:80]
        kept["artifact"] = artifacts.save_bytes(ctx.task.pk, f"{prefix}download-{artifact}", data)
    return kept


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass

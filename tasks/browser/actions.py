"""The browser steps real flows need besides browse, click, fill and pick: ``press`` (keys),
``select`` (options of a list box), ``upload`` (files of the task's copy), ``wait`` (for text, an
element, an address or the network), ``tab`` (back to another tab), and ``extract`` from plain
words (the configured model reads the page; its answer follows the step's JSON Schema).

The acting ones run inside ``tasks.browser.steps``: the same origin hold, payment guard, dialog
answers, new tabs, downloads and before/after evidence as a click. ``press`` of a key that
submits (Enter in a form, Enter or Space on a button) is judged as a click on the control it
would press; ``select`` in a card field is card data like a ``fill``.
"""
from __future__ import annotations

import json
import mimetypes
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import FilePayload

from tasks.browser import pages, payment, steps
from tasks.browser.session import BrowserSession
from tasks.llm.client import ModelError, NoModel
from tasks.run import artifacts
from tasks.run.evidence import Evidence, StepFailed, bounded
from tasks.spec.browser_steps import TARGET_KEYS
from tasks.workers.asking import ask_model
from tasks.workers.file_steps import inside

if TYPE_CHECKING:
    from tasks.run.context import RunContext

MAX_UPLOAD_BYTES = 50 * 1024 * 1024  # what Playwright hands a page in one file
PAGE_CHARS = 30_000  # of the page's text a model reads for an extract
FRAME_CHARS = 5_000  # of each frame's
# Keys that press the focused control (a button, a link) or submit the form the focus is in.
_ACTIVATES = ("Enter", "NumpadEnter", "Space", " ")
_SUBMITS = ("Enter", "NumpadEnter")


def execute(ctx: RunContext, session: BrowserSession, kind: str, value: Any, step: dict[str, Any], *,
            index: int, approved: bool, replay: bool = False) -> tuple[Any, Evidence]:
    """Run browser step ``kind`` (any of ``tasks.browser.kinds.KINDS``); its result and evidence."""
    if kind == "extract" and isinstance(value, dict) and "describe" in value:
        return extract_by_model(ctx, session, value, step, index=index)
    act = _ACTS.get(kind)
    read = _wait if kind == "wait" else None
    return steps.execute(ctx, session, kind, value, step, index=index, approved=approved, replay=replay, act=act, read=read)


# -- press -----------------------------------------------------------------------------------------
_PRESSES_JS = """e => {
    const tag = e.tagName.toLowerCase(), type = (e.getAttribute('type') || '').toLowerCase();
    const info = c => {
        const attr = n => c.getAttribute(n) || undefined;
        const label = c.labels && c.labels.length ? c.labels[0].innerText.trim() : undefined;
        return {tag: c.tagName.toLowerCase(), id: c.id || undefined, name: attr('name'), type: attr('type'), role: attr('role'),
                ariaLabel: attr('aria-label'), label: label, autocomplete: attr('autocomplete'),
                text: (c.innerText || (c.value && ['submit', 'button'].includes(c.type) && c.value) || '').trim().slice(0, 200) || undefined};
    };
    if (tag === 'iframe' || tag === 'frame') return {how: 'frame', focused: info(e)};
    if (tag === 'button' || tag === 'a' || e.getAttribute('role') === 'button' ||
        (tag === 'input' && ['submit', 'button', 'image', 'reset'].includes(type))) return {how: 'control', control: info(e), focused: info(e)};
    const form = e.form || e.closest('form');
    if (!form || tag === 'textarea' || tag === 'select') return {how: 'none', focused: info(e)};
    const submit = form.querySelector('button:not([type]), button[type=submit], input[type=submit], input[type=image]');
    return submit ? {how: 'form', control: info(submit), focused: info(e)} : {how: 'form', focused: info(e)};
}"""


def _press(call: steps.Call, evidence: Evidence) -> tuple[Any, dict[str, Any]]:
    spec: dict[str, Any] = {"keys": call.value} if isinstance(call.value, str) else call.value
    keys = [spec["keys"]] if isinstance(spec["keys"], str) else [str(k) for k in spec["keys"]]
    target = steps.find_target(call, spec) if any(k in spec for k in TARGET_KEYS) else None
    element: dict[str, Any] = {}
    for chord in keys:
        focus = target if target is not None else call.page.locator("*:focus").first
        has_focus = target is not None or focus.count() > 0
        what: dict[str, Any] = focus.evaluate(_PRESSES_JS) if has_focus else {"how": "none", "focused": {"tag": "body"}}
        element = element or what["focused"]
        _guard_press(call, chord, what, evidence)
        if target is not None:
            target.press(chord, timeout=call.timeout_ms)
        else:
            call.page.keyboard.press(chord)
    return keys if len(keys) > 1 else keys[0], element


def _guard_press(call: steps.Call, chord: str, what: dict[str, Any], evidence: Evidence) -> None:
    """A key that would press a control or submit a form is guarded like a click on it. Enter in
    a form with no submit control, or with the focus in a frame, stops on any payment signal:
    when unsure, it stops."""
    key = chord.rsplit("+", 1)[-1] if chord != "+" else "+"
    how = what["how"]
    if how == "control" and key in _ACTIVATES or how == "form" and key in _SUBMITS and what.get("control"):
        steps.guard_payment_click(call, what["control"], evidence)
    elif (how == "form" and key in _SUBMITS) or (how == "frame" and key in _ACTIVATES):
        signals = payment.page_signals(call.page)
        if signals:
            steps.stop_before_paying(call, signals, {"text": f"{chord} (it submits the form)"}, evidence)


# -- select ----------------------------------------------------------------------------------------
def _select(call: steps.Call, evidence: Evidence) -> tuple[Any, dict[str, Any]]:
    spec = call.value
    wanted = [spec["option"]] if isinstance(spec["option"], str) else [str(o) for o in spec["option"]]
    target = steps.find_target(call, spec)
    element = steps.describe(target)
    if element.get("tag") != "select":
        raise StepFailed(f"'select' chooses options of a list box (<select>); the target is a <{element.get('tag')}>"
                         " (for other lists use 'pick')")
    for option in wanted:
        steps.guard_payment_fill(call, element, option, evidence)
    chosen = pages.choose_options(target, wanted, call.timeout_ms)
    return (chosen if len(chosen) > 1 else chosen[0]), {**element, "chose": chosen}


# -- upload ----------------------------------------------------------------------------------------
def _upload(call: steps.Call, evidence: Evidence) -> tuple[Any, dict[str, Any]]:
    spec = call.value
    names = [spec["file"]] if isinstance(spec["file"], str) else [str(f) for f in spec["file"]]
    payloads = [_read_upload(Path(call.ctx.workdir), name) for name in names]
    target = steps.find_target(call, spec, first=False).first  # a file input is often hidden behind its label
    element = steps.describe(target)
    if element.get("tag") == "input" and str(element.get("type", "")).lower() == "file":
        target.set_input_files(payloads, timeout=call.timeout_ms)
    else:  # a button that opens the file chooser
        steps.guard_payment_click(call, element, evidence)
        with call.page.expect_file_chooser(timeout=call.timeout_ms) as chooser:
            target.click(timeout=call.timeout_ms)
        chooser.value.set_files(payloads, timeout=call.timeout_ms)
    sent = [{"file": name, "bytes": len(p["buffer"])} for name, p in zip(names, payloads, strict=True)]
    return names if len(names) > 1 else names[0], {**element, "files": sent}


def _read_upload(workdir: Path, name: str) -> FilePayload:
    """A file of the task's copy, by a relative path with no ``..``; a link is followed only to
    a file inside the copy."""
    if name.startswith("/") or ".." in name.replace("\\", "/").split("/"):
        raise StepFailed(f"'{name}' is not a path inside the task's files (relative, no '..')")
    path = inside(workdir, name)
    real = path.resolve()
    root = workdir.resolve()
    if root not in real.parents:
        raise StepFailed(f"'{name}' leads outside the task's files")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StepFailed(f"there is no file '{name}' in the task's files") from None
    except OSError as exc:
        raise StepFailed(f"'{name}' cannot be read: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StepFailed(f"'{name}' is not a plain file")
        if st.st_size > MAX_UPLOAD_BYTES:
            raise StepFailed(f"'{name}' is {st.st_size} bytes; a browser upload takes at most {MAX_UPLOAD_BYTES}")
        data = handle.read(MAX_UPLOAD_BYTES + 1)
    kind, _ = mimetypes.guess_type(real.name)
    return {"name": real.name, "mimeType": kind or "application/octet-stream", "buffer": data}


# -- tab -------------------------------------------------------------------------------------------
def _tab(call: steps.Call, evidence: Evidence) -> tuple[Any, dict[str, Any]]:
    context = call.page.context
    tabs = [p for p in context.pages if not p.is_closed()]
    watch = pages.watch(call.session)
    current = call.page
    spec = call.value
    if spec == "first":
        chosen = tabs[0]
    elif spec == "last":
        chosen = tabs[-1]
    elif spec == "previous":
        earlier = [p for p in watch.history if not p.is_closed() and p is not current]
        if not earlier:
            raise StepFailed("there is no earlier tab to go back to")
        chosen = earlier[-1]
    elif "index" in spec:
        if spec["index"] > len(tabs):
            raise StepFailed(f"there are {len(tabs)} tabs, not {spec['index']}")
        chosen = tabs[int(spec["index"]) - 1]
    else:
        found = [p for p in tabs if str(spec["url"]) in p.url]
        if not found:
            raise StepFailed(f"no tab has {spec['url']!r} in its address (open: {', '.join(p.url[:80] for p in tabs)})")
        chosen = found[0]
    if chosen is not current:
        watch.history.append(current)
        call.session.use_page(chosen)
    return {"url": chosen.url, "tab": tabs.index(chosen) + 1, "of": len(tabs)}, {}


_ACTS: dict[str, steps.Act] = {"press": _press, "select": _select, "upload": _upload, "tab": _tab}


# -- wait ------------------------------------------------------------------------------------------
def _wait(call: steps.Call) -> tuple[Any, Evidence]:
    spec: Any = call.value
    clock = time.monotonic()
    if isinstance(spec, str):
        spec = {"network": "idle"} if spec == "network" else {"load": True} if spec == "load" else {"selector": spec}
    page = call.page
    result: Any = None
    try:
        if "network" in spec:
            page.wait_for_load_state("networkidle", timeout=call.timeout_ms)
            what = "the network to be idle"
        elif "load" in spec:
            page.wait_for_load_state("load", timeout=call.timeout_ms)
            what = "the page to load"
        elif "url" in spec:
            part = str(spec["url"])
            what = f"an address with {part!r}"
            page.wait_for_url(lambda url: part in url, timeout=call.timeout_ms)
            result = page.url
        else:
            state = spec.get("state", "visible")
            what = f"{_words(spec)} to be {state}"
            found = steps.locate(pages.root_for(page, spec, call.timeout_ms), spec).first
            found.wait_for(state=state, timeout=call.timeout_ms)
            if state in ("visible", "attached"):
                result = found.evaluate("e => (e.innerText || e.textContent || '').trim().slice(0, 2000)")
    except PlaywrightError as exc:
        raise StepFailed(f"waited {call.timeout_s:g} s for {_words(spec) if 'network' not in spec else 'the network to be idle'}; "
                         "it did not happen", page_text=steps.page_text(page),
                         evidence=Evidence({"url": page.url, "waitedMs": int((time.monotonic() - clock) * 1000)})) from exc
    return result, Evidence({"url": page.url, "title": page.title(), "waited": what,
                             "waitedMs": int((time.monotonic() - clock) * 1000)})


def _words(spec: dict[str, Any]) -> str:
    for key in (*TARGET_KEYS, "url", "load"):
        if key in spec:
            return f"{key} {spec[key]!r}"
    return "the page"


# -- extract from plain words ------------------------------------------------------------------------
_READ_SYSTEM = ("You read a web page for a step of a task and answer with exactly the data the step asks for, taken "
                "from the page's text. Do not invent values the page does not show: use null, or leave them out.")


def extract_by_model(ctx: RunContext, session: BrowserSession, value: dict[str, Any], step: dict[str, Any], *,
                     index: int) -> tuple[Any, Evidence]:
    """The model reads the page's text (every frame's) and answers ``describe``; with ``schema``
    its answer is JSON that follows it. Page work on the browser's thread, the model call on the
    worker's (it is logged and charged)."""
    instruction = str(value["describe"])
    schema = value.get("schema")
    timeout_ms = float(step.get("timeout_s") or steps.DEFAULT_TIMEOUT_S) * 1000
    try:
        seen = session.call(lambda: _page_for_model(session, timeout_ms))
    finally:
        steps.record_blocked(ctx, session)
        steps.record_dialogs(ctx, session)
    prompt = f"Read: {instruction}\nPage: {seen['title']} ({seen['url']})\nText of the page:\n{seen['text']}"
    messages = [{"role": "system", "content": _READ_SYSTEM}, {"role": "user", "content": prompt}]
    asked = {"url": seen["url"], "title": seen["title"], "instruction": instruction,
             "prompt": bounded(ctx.recorder.redactor.text(prompt), chars=4000)}
    try:
        decision, answer = ask_model(ctx, messages, purpose=f"step {index + 1}: read '{instruction}'", schema=schema)
    except NoModel as exc:
        raise StepFailed(f"'extract' with 'describe' needs a model to read the page: {exc}", evidence=Evidence(asked)) from exc
    except ModelError as exc:
        raise StepFailed(f"the model could not read '{instruction}': {exc}", evidence=Evidence(asked)) from exc
    evidence = Evidence({**asked, "decision": decision.shown(), "answer": bounded(ctx.recorder.redactor.redact(answer)),
                         "costCents": round(decision.cost_cents, 4)})
    name = f"step-{index + 1}-run-{ctx.run.number}-answer.json"
    evidence.artifacts.append(artifacts.save_text(ctx.task.pk, name, json.dumps(answer, indent=1, default=str),
                                                  ctx.recorder.redactor))
    return answer, evidence


def _page_for_model(session: BrowserSession, timeout_ms: float) -> dict[str, Any]:
    page = session.page
    try:
        page.wait_for_load_state("load", timeout=min(timeout_ms, 10_000))
    except PlaywrightError:
        pass  # read what is there
    text = steps.page_text(page)[:PAGE_CHARS]
    for frame in page.frames[1:]:
        try:
            inner = str(frame.evaluate("() => document.body ? document.body.innerText : ''"))[:FRAME_CHARS].strip()
        except PlaywrightError:
            continue
        if inner:
            text += f"\n[frame {frame.url[:200]}]\n{inner}"
    return {"url": page.url, "title": page.title(), "text": text}

"""The browser steps of a flow: ``browse``, ``click``, ``fill``, ``pick``, ``extract``, ``screenshot``.

A target (``click``, ``fill``, ``pick``, ``extract``) is found by a Playwright selector string
(CSS, or ``text=…``/``role=…``), or an object with one of ``selector`` (CSS), ``text`` (visible
text), ``role`` with an optional ``name`` (accessible name), ``label`` or ``placeholder``.

Every acting step (browse, click, fill, pick) stores, before the next step starts: a screenshot
before and after it acted and the page's accessibility snapshot it acted on (artifacts), plus the
URL, title and the element it chose (the result event). A field holding a secret fact is
transparent in every screenshot, and the snapshot passes the task's redactor.

A control that would complete a purchase, and card data typed anywhere, are guarded here (the
signals live in ``tasks.browser.payment``): ``PaymentStop`` and
``tasks.tools.registry.NeedsApproval`` go up to the flow worker, which pauses.
"""
from __future__ import annotations

import base64
import json
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from playwright.sync_api import CDPSession, Frame, FrameLocator, Locator, Page
from playwright.sync_api import Error as PlaywrightError

from boxsite.core.cards import looks_like_card
from tasks.browser import origins, pages, payment, walls
from tasks.browser.kinds import ACTING, DEFAULT_TIMEOUT_S, KINDS, PaymentStop
from tasks.browser.session import BrowserSession
from tasks.models import EventKind
from tasks.pauses import ApprovalKind
from tasks.run import artifacts
from tasks.run.evidence import Evidence, StepFailed, bounded
from tasks.spec.flows import TARGET_KEYS
from tasks.tools.registry import NeedsApproval

if TYPE_CHECKING:
    from tasks.run.context import RunContext

__all__ = ["ACTING", "DEFAULT_TIMEOUT_S", "KINDS", "PaymentStop", "execute"]

PAGE_TEXT_CHARS = 20_000
SECRET_MARK = "data-box-secret"
# A secret field is drawn empty: its text and caret transparent (the field itself stays).
_MASK_CSS = f"[{SECRET_MARK}] {{ color: transparent !important; text-shadow: none !important; caret-color: transparent !important; }}"
# The box keeps that rule in the page itself, as a constructed style sheet adopted by the document
# (and by the shadow root of each field it marks): an image drawn straight through DevTools is
# then masked as Playwright's own screenshot with ``style`` is. An adopted sheet is outside the
# DOM a page rebuilds and outside its Content-Security-Policy; one the page drops comes back at
# the next mark, which comes before every image.
_ENSURE_MASK_JS = f"""root => {{
    if (root.adoptedStyleSheets.some(s => s.boxSecretMask)) return;
    const sheet = new (root.ownerDocument || root).defaultView.CSSStyleSheet();
    sheet.replaceSync({json.dumps(_MASK_CSS)});
    sheet.boxSecretMask = true;
    root.adoptedStyleSheets = [...root.adoptedStyleSheets, sheet];
}}"""


@dataclass
class Call:
    """One browser step being executed."""

    ctx: RunContext
    session: BrowserSession
    kind: str
    value: Any
    index: int
    timeout_s: float
    approved: bool
    replay: bool = False  # re-opening the page in a new run: act, store no evidence
    dialog: Any = None  # the step's answer to a dialog the page opens while it acts (tasks.browser.pages)

    @property
    def page(self) -> Page:
        return self.session.page

    @property
    def timeout_ms(self) -> float:
        return self.timeout_s * 1000

    def artifact(self, suffix: str) -> str:
        return f"step-{self.index + 1}-run-{self.ctx.run.number}-{suffix}"


# How a step of a kind of its own acts (``tasks.browser.actions``): on the session's thread, with
# the step's evidence to add to; the step's result and the element it acted on.
Act = Callable[["Call", Evidence], tuple[Any, dict[str, Any]]]
# How a reading step of a kind of its own runs; its result and evidence.
Read = Callable[["Call"], tuple[Any, Evidence]]


def execute(ctx: RunContext, session: BrowserSession, kind: str, value: Any, step: dict[str, Any], *,
            index: int, approved: bool, replay: bool = False, act: Act | None = None,
            read: Read | None = None) -> tuple[Any, Evidence]:
    """Run browser step ``kind`` with its resolved ``value``; its result and evidence. ``act``
    (an acting step) or ``read`` runs a kind this module does not know, inside the same guards
    and evidence."""
    call = Call(ctx, session, kind, value, index, float(step.get("timeout_s") or DEFAULT_TIMEOUT_S), approved, replay,
                dialog=step.get("dialog"))
    try:
        return session.call(lambda: _execute(call, act, read))
    finally:
        record_blocked(ctx, session)
        record_dialogs(ctx, session)


def _execute(call: Call, act: Act | None, read: Read | None) -> tuple[Any, Evidence]:
    """On the session's thread: no database here (``BrowserSession``)."""
    # The last acting step's after-image stands for this step's before-image only for this step,
    # and only while the page has not changed since (``_capture``).
    shot, call.session.last_shot = call.session.last_shot, None
    try:
        pages.watch(call.session)  # before anything: no dialog of the page is left unanswered
        if read is not None:
            return read(call)
        if call.kind in ACTING:
            return _acting(call, act, shot)
        if call.kind == "extract":
            return _extract(call)
        return _screenshot(call)
    except PlaywrightError as exc:
        raise _failure(call, _playwright_message(exc)) from exc


# -- acting steps ------------------------------------------------------------------------------
def _acting(call: Call, act: Act | None, shot: Shot | None = None) -> tuple[Any, Evidence]:
    evidence = Evidence()
    if call.kind == "browse":
        url = call.value if isinstance(call.value, str) else str(call.value["url"])
        if not origins.allowed(url, call.ctx.task.constraints):
            _record_blocked(call, url)
            raise StepFailed(f"{origins.origin_of(url)} is not in constraints.origins; the page was not opened",
                             evidence=Evidence({"url": url, "blocked": "not in constraints.origins"}))
    where_before = _capture(call, "before", evidence, snapshot=True, shot=shot)
    before = {"before": where_before} if where_before else {}
    result: Any = None
    element: dict[str, Any] = {}
    refused_before = len(call.session.blocked)
    watch = pages.watch(call.session)
    watch.before(call.ctx, call.dialog)
    try:
        if act is not None:
            result, element = act(call, evidence)
        elif call.kind == "browse":
            result, element = _browse(call, url), {}
        elif call.kind == "click":
            target, element = _target_described(call, call.value)
            _guard_payment_click(call, target, element, evidence)
            target.click(timeout=call.timeout_ms)
            result = element.get("text") or element.get("name") or ""
        elif call.kind == "fill":
            result, element = _fill(call, evidence)
        else:
            result, element = _pick(call, evidence)
        _settle(call)
        evidence.data.update(watch.after(call.ctx, call.timeout_ms, call.artifact("")))
        _hold_origins(call, refused_before)
    except StepFailed as exc:
        exc.evidence = _merge(evidence, exc.evidence, element)
        exc.evidence.data.update(watch.stop())
        _capture(call, "after", exc.evidence)
        exc.evidence.data.update(_where(call.page))
        raise
    except PlaywrightError as exc:
        refused = _refused_since(call, refused_before)
        failure = refused or _failure(call, _playwright_message(exc))
        failure.evidence = _merge(evidence, failure.evidence, element)
        failure.evidence.data.update(watch.stop())
        raise failure from exc
    finally:
        watch.stop()
    where = _capture(call, "after", evidence, keep=True) or _where(call.page)
    evidence.data.update({**before, **where, **({"element": element} if element else {})})
    return result, evidence


def _refused_since(call: Call, mark: int) -> StepFailed | None:
    """The step failure for a page the origin guard refused during this action (a redirect, a
    link, a form that led to another site), or None."""
    refused = call.session.blocked[mark:]
    if not refused:
        return None
    first = refused[0]
    how = "a redirect led" if first.get("redirect") else "the page tried to go"
    return StepFailed(f"{how} to {first['origin']}, which is not in constraints.origins; that page was not opened",
                      evidence=Evidence({"refused": first["url"]}))


def _hold_origins(call: Call, mark: int) -> None:
    """After an action: the page is on an allowed site (or on the error page of a navigation the
    guard refused, which is this step's failure)."""
    main_refused = call.page.url.startswith("chrome-error:")
    refused = _refused_since(call, mark) if main_refused else None
    if refused is not None:
        raise refused
    if not origins.allowed(call.page.url, call.ctx.task.constraints):
        raise StepFailed(f"the page is on {origins.origin_of(call.page.url)}, which is not in constraints.origins",
                         evidence=Evidence({"refused": call.page.url[:500]}))


def _browse(call: Call, url: str) -> dict[str, Any]:
    response = call.page.goto(url, wait_until="load", timeout=call.timeout_ms)
    status = response.status if response is not None else None
    if status is not None and status >= 400:
        raise StepFailed(f"HTTP {status} from {url}", page_text=page_text(call.page), evidence=Evidence({"status": status}))
    return {"url": call.page.url, "title": call.page.title(), **({"status": status} if status is not None else {})}


def _fill(call: Call, evidence: Evidence) -> tuple[Any, dict[str, Any]]:
    if not isinstance(call.value, dict) or "value" not in call.value:
        raise StepFailed("'fill' needs a target and a 'value'")
    target, element = _target_described(call, call.value)
    text = "" if call.value["value"] is None else str(call.value["value"])
    secret = _holds_secret(call, text)
    _guard_payment_fill(call, element, text, secret, evidence)
    if secret:
        target.evaluate(f"e => {{ e.setAttribute('{SECRET_MARK}', ''); ({_ENSURE_MASK_JS})(e.getRootNode()); }}")
    if element.get("tag") == "select":
        target.select_option(label=text, timeout=call.timeout_ms)
    else:
        target.fill(text, timeout=call.timeout_ms)
    shown = {**element, "secret": secret}
    return (None if secret else text), shown


def _pick(call: Call, evidence: Evidence) -> tuple[Any, dict[str, Any]]:
    spec = call.value if isinstance(call.value, dict) else {"selector": call.value}
    target = _target(call, spec, first=False)
    first = target.first
    first.wait_for(state="attached", timeout=call.timeout_ms)
    if first.evaluate("e => e.tagName.toLowerCase()") == "select":
        option = spec.get("option")
        if option is None:
            raise StepFailed("'pick' on a list box needs 'option' (its label or value)")
        element = describe(first)
        chosen = pages.choose_options(first, [str(option)], call.timeout_ms)
        return {"value": chosen[0]}, {**element, "chose": chosen}
    items = [target.nth(i) for i in range(target.count())]
    texts = [_visible_text(item) for item in items]
    where = spec.get("where")
    candidates = [(i, t) for i, t in enumerate(texts) if not where or str(where).lower() in t.lower()]
    if not candidates:
        raise StepFailed(f"no item matches{' ' + repr(where) if where else ''} among {len(items)}", page_text=page_text(call.page))
    by = str(spec.get("by", "first")).lower()
    if by in ("cheapest", "lowest", "highest", "dearest"):
        priced = [(i, t, _price(items[i], t, spec.get("price"))) for i, t in candidates]
        priced = [p for p in priced if p[2] is not None]
        if not priced:
            raise StepFailed("no item shows a price to compare", page_text=page_text(call.page))
        high = by in ("highest", "dearest")
        index, text, price = (max if high else min)(priced, key=lambda p: p[2])  # type: ignore[arg-type, return-value]
    elif by == "last":
        index, text = candidates[-1]
        price = None
    elif by == "first":
        index, text = candidates[0]
        price = None
    else:
        raise StepFailed(f"'by' is one of first, last, cheapest, highest; not {by!r}")
    chosen_item = items[index]
    element = {**describe(chosen_item), "position": index + 1, "of": len(items), **({"price": price} if price is not None else {})}
    press = spec.get("click", True)
    if press:
        control = chosen_item if press is True else _target_in(chosen_item, press)
        control_element = describe(control)
        _guard_payment_click(call, control, control_element, evidence)
        control.click(timeout=call.timeout_ms)
        if press is not True:
            element["pressed"] = control_element
    return {"value": text}, element


def _settle(call: Call) -> None:
    """Let a navigation the action started arrive (a click that submits a form)."""
    try:
        call.page.wait_for_load_state("load", timeout=min(call.timeout_ms, 10_000))
    except PlaywrightError:
        pass  # still loading: the next step waits for what it needs


# -- reading steps -----------------------------------------------------------------------------
def _extract(call: Call) -> tuple[Any, Evidence]:
    spec = call.value if isinstance(call.value, dict) else {"selector": call.value}
    target = _target(call, spec, first=False) if any(k in spec for k in TARGET_KEYS) else call.page.locator("body")
    target.first.wait_for(state="attached", timeout=call.timeout_ms)
    fields = spec.get("fields")
    rows: list[dict[str, Any]] = []
    for i in range(target.count()):
        item = target.nth(i)
        if isinstance(fields, dict):
            row = {}
            for name, sub in fields.items():
                found = _target_in(item, sub)
                row[str(name)] = _visible_text(found.first) if found.count() else None
            rows.append(row)
        elif item.evaluate("e => e.tagName.toLowerCase()") == "table":
            rows.extend(_table_rows(item))
        else:
            rows.append({"value": _visible_text(item)})
    limit = spec.get("limit")
    if isinstance(limit, int) and limit > 0:
        rows = rows[:limit]
    evidence = Evidence({**_where(call.page), "rows": len(rows), "records": bounded(call.ctx.recorder.redactor.redact(rows))})
    evidence.artifacts.append(artifacts.save_text(call.ctx.task.pk, call.artifact("rows.json"), json.dumps(rows, indent=1),
                                                  call.ctx.recorder.redactor))
    return rows, evidence


def _table_rows(table: Locator) -> list[dict[str, Any]]:
    cells: list[list[str]] = table.evaluate(
        "t => Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.innerText.trim()))")
    if not cells:
        return []
    header, body = cells[0], cells[1:]
    names = [h or f"column {n + 1}" for n, h in enumerate(header)]
    return [{names[n] if n < len(names) else f"column {n + 1}": v for n, v in enumerate(row)} for row in body]


def _screenshot(call: Call) -> tuple[Any, Evidence]:
    spec = call.value if isinstance(call.value, dict) else {}
    evidence = Evidence(_where(call.page))
    name = call.artifact("screenshot.png")
    data = take_screenshot(call, full_page=bool(spec.get("full_page")))
    evidence.artifacts.append(artifacts.save_bytes(call.ctx.task.pk, name, data))
    return name, evidence


# -- evidence ----------------------------------------------------------------------------------
def take_screenshot(call: Call, *, full_page: bool = False) -> bytes:
    """A PNG of the page with every field that holds a secret drawn empty."""
    return _draw(call, full_page=full_page).image


@dataclass
class Shot:
    """The page as it was drawn: its URL, masked PNG, title and the change marks of its document
    and of each of its frames (``_CHANGES_JS``)."""

    url: str
    image: bytes
    title: str
    mark: str


# One DevTools session per page, for its images: Page.captureScreenshot answers in one round trip,
# where Playwright's screenshot adds its own (styles in and out of every frame, waits). The PNG is
# encoded for speed: a larger file, drawn sooner.
_CDP: weakref.WeakKeyDictionary[Page, CDPSession] = weakref.WeakKeyDictionary()
# A count of the changes of the document since it was first drawn (DOM mutations, and typed or
# chosen values, which are not mutations) and a mark of the document itself: an image of an
# earlier moment stands for now only while this reads the same. Kept on the window as a property
# a page's scripts do not list.
_CHANGES_KEY = "__boxChanges"
_CHANGES_JS = f"""() => {{
    let w = window.{_CHANGES_KEY};
    if (!w) {{
        w = {{id: Math.random().toString(36).slice(2), n: 0}};
        w.obs = new MutationObserver(records => {{ w.n += records.length; }});
        w.obs.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
        const bump = () => {{ w.n += 1; }};
        document.addEventListener('input', bump, true);
        document.addEventListener('change', bump, true);
        Object.defineProperty(window, '{_CHANGES_KEY}', {{value: w, enumerable: false}});
    }}
    w.n += w.obs.takeRecords().length;
    return w.id + ':' + w.n;
}}"""


def _draw(call: Call, *, full_page: bool = False) -> Shot:
    """The page now: its masked PNG, and its title and change mark (read by the same call that
    marks the secrets)."""
    page = call.page
    url = page.url
    title, mark = _mark_secret_fields(call)
    if full_page:
        data: bytes = page.screenshot(type="png", full_page=True, style=_MASK_CSS, animations="disabled",
                                      caret="hide", timeout=call.timeout_ms)
        return Shot(url, data, title, mark)
    params = {"format": "png", "optimizeForSpeed": True}
    cdp = _CDP.get(page)
    try:
        if cdp is None:
            cdp = _CDP[page] = page.context.new_cdp_session(page)
        shot = cdp.send("Page.captureScreenshot", params)
    except PlaywrightError:
        # A session the browser let go of (its target swapped): one new one, then the error stands.
        _CDP.pop(page, None)
        cdp = _CDP[page] = page.context.new_cdp_session(page)
        shot = cdp.send("Page.captureScreenshot", params)
    return Shot(url, base64.b64decode(shot["data"]), title, mark)


# Marks every field of a document (and its open shadow roots) whose value holds a secret or a
# card number, and makes sure each root that holds a marked field holds the mask rule.
_MARK_JS = """([mark, secrets]) => {
    const card = /(?:\\d[ -]?){13,19}/;
    const ensure = ENSURE;
    const visit = root => {
        for (const e of root.querySelectorAll('input, textarea')) {
            const v = e.value || '';
            if (v && (card.test(v) || secrets.some(s => v.includes(s)))) e.setAttribute(mark, '');
        }
        if (root === document || root.querySelector('[' + mark + ']')) ensure(root);
        for (const e of root.querySelectorAll('*')) if (e.shadowRoot) visit(e.shadowRoot);
    };
    visit(document);
}""".replace("ENSURE", _ENSURE_MASK_JS)
_MARK_FRAME_JS = f"""args => {{
    ({_MARK_JS})(args);
    return ({_CHANGES_JS})();
}}"""
_MARK_PAGE_JS = f"""args => {{
    ({_MARK_JS})(args);
    return [document.title, ({_CHANGES_JS})()];
}}"""


def _mark_secret_fields(call: Call) -> tuple[str, str]:
    """Mark the secret fields, wherever their value came from, in the page and in each of its
    frames (a frame's document holds its own rule, which its page may drop like any other); the
    page's title and the change marks of its frames and document (``_frame_marks``, read after
    the marking). A frame that cannot be marked fails the drawing, so no image is stored rather
    than one unmasked."""
    secrets = [v for v in call.ctx.recorder.redactor.secrets.values() if len(str(v)) >= 4]
    args = [SECRET_MARK, [str(s) for s in secrets]]
    marks = _frame_marks(call.page, _MARK_FRAME_JS, args)
    title, mark = call.page.evaluate(_MARK_PAGE_JS, args)
    return str(title), " ".join([str(mark), *marks])


def _frame_marks(page: Page, script: str, args: Any = None) -> list[str]:
    """``script``'s change mark from each frame of the page but its main one; a frame gone
    meanwhile is not drawn and has no mark."""
    marks = []
    for frame in page.frames:
        if frame is page.main_frame:
            continue
        try:
            marks.append(str(frame.evaluate(script, args)))
        except PlaywrightError:
            if not frame.is_detached():
                raise
    return marks


def _unchanged(call: Call, shot: Shot) -> bool:
    """The page is still the one ``shot`` drew: same URL, same documents (the page's and its
    frames'), no change in any of them since."""
    if shot.url != call.page.url:
        return False
    try:
        # On a new document this starts its count, under a new mark: never the shot's.
        marks = _frame_marks(call.page, _CHANGES_JS)
        return " ".join([str(call.page.evaluate(_CHANGES_JS)), *marks]) == shot.mark
    except PlaywrightError:
        return False


def _capture(call: Call, moment: str, evidence: Evidence, *, snapshot: bool = False,
             shot: Shot | None = None, keep: bool = False) -> dict[str, Any]:
    """Store the page as it is now (``before``/``after``): a screenshot, and with ``snapshot``
    its accessibility tree. Returns the fields for the result event: where the page is.

    ``shot`` is the previous acting step's after-image: the page as that step left it, drawn
    with the same masking, so a step whose page has not changed since (``_unchanged``) stores it
    as its before-image instead of drawing the page again. ``keep`` leaves this image for the
    next step.
    """
    shown: dict[str, Any] = {}
    if call.replay:
        return shown
    try:
        drawn = shot if shot is not None and _unchanged(call, shot) else _draw(call)
        evidence.artifacts.append(artifacts.save_bytes(call.ctx.task.pk, call.artifact(f"{moment}.png"), drawn.image))
        if keep:
            call.session.last_shot = drawn
        if snapshot:
            tree = call.page.locator("body").aria_snapshot(timeout=call.timeout_ms)
            saved = artifacts.save_text(call.ctx.task.pk, call.artifact("snapshot.txt"), tree, call.ctx.recorder.redactor)
            evidence.artifacts.append(saved)
        shown = {"url": drawn.url, "title": drawn.title}
    except PlaywrightError:
        pass  # a page that cannot be drawn (gone, crashed) must not hide the step's own result
    return shown


def _where(page: Page) -> dict[str, Any]:
    try:
        return {"url": page.url, "title": page.title()}
    except PlaywrightError:
        return {}


def _merge(evidence: Evidence, other: Evidence, element: dict[str, Any]) -> Evidence:
    merged = Evidence({**evidence.data, **other.data}, [*evidence.artifacts, *other.artifacts])
    if element:
        merged.data["element"] = element
    return merged


def _failure(call: Call, message: str) -> StepFailed:
    text = ""
    try:
        text = page_text(call.page)
    except PlaywrightError:
        pass
    return StepFailed(message, page_text=text, evidence=Evidence(_where(call.page)))


def page_text(page: Page) -> str:
    """What a person sees on the page (for walls), then the wall marks of its DOM and frames
    (``walls.page_marks``: a captcha's frame, a one-time-code field, a visible password field)."""
    text: str = page.evaluate("() => document.body ? document.body.innerText : ''")
    marks = walls.page_marks(page)
    return (text[:PAGE_TEXT_CHARS] + "".join(f"\n{m}" for m in marks))


def _playwright_message(exc: PlaywrightError) -> str:
    first = (exc.message or str(exc)).strip().splitlines()
    message = first[0] if first else "the browser failed"
    return re.sub(r"^(Locator|Page|ElementHandle)\.\w+: ", "", message)[:500]


# -- targets -----------------------------------------------------------------------------------
def _target(call: Call, spec: Any, *, first: bool = True) -> Locator:
    """The element(s) ``spec`` names on the page; waits up to the step's timeout for the first."""
    locator = _locator(call, spec)
    return _waited(call, spec, locator.first, visible=True) if first else _waited(call, spec, locator, visible=False)


def _locator(call: Call, spec: Any) -> Locator:
    return _locate(pages.root_for(call.page, spec, call.timeout_ms), spec)


def _waited(call: Call, spec: Any, locator: Locator, *, visible: bool) -> Locator:
    """``locator``, once its first element is on the page (and visible), within the step's timeout."""
    try:
        locator.first.wait_for(state="visible" if visible else "attached", timeout=call.timeout_ms)
    except PlaywrightError as exc:
        raise StepFailed(f"nothing on the page matches {_spec_words(spec)}", page_text=page_text(call.page)) from exc
    return locator


def _locate(root: Page | Frame | FrameLocator | Locator, spec: Any) -> Locator:
    if isinstance(spec, str):
        return root.locator(spec)
    if not isinstance(spec, dict):
        raise StepFailed("a target is a selector string or an object with selector, text, role, label or placeholder")
    if "selector" in spec:
        return root.locator(str(spec["selector"]))
    if "text" in spec:
        return root.get_by_text(str(spec["text"]), exact=bool(spec.get("exact", False)))
    if "role" in spec:
        name = spec.get("name")
        return root.get_by_role(spec["role"], name=str(name) if name is not None else None, exact=bool(spec.get("exact", False)))
    if "label" in spec:
        return root.get_by_label(str(spec["label"]), exact=bool(spec.get("exact", False)))
    if "placeholder" in spec:
        return root.get_by_placeholder(str(spec["placeholder"]), exact=bool(spec.get("exact", False)))
    raise StepFailed("a target needs one of selector, text, role, label or placeholder")


def find_target(call: Call, spec: Any, *, first: bool = True) -> Locator:
    """The element(s) a step names (``_target``), for the kinds of ``tasks.browser.actions``."""
    return _target(call, spec, first=first)


def locate(root: Page | Frame | FrameLocator | Locator, spec: Any) -> Locator:
    """What ``spec`` names under ``root``, without waiting (``_locate``)."""
    return _locate(root, spec)


def guard_payment_click(call: Call, element: dict[str, Any], evidence: Evidence) -> None:
    """Stop or ask before pressing ``element`` on a payment page (``_guard_payment_click``)."""
    _guard_payment_click(call, call.page.locator("body"), element, evidence)


def guard_payment_fill(call: Call, element: dict[str, Any], text: str, evidence: Evidence) -> None:
    """Card data goes only where ``_guard_payment_fill`` lets it."""
    _guard_payment_fill(call, element, text, _holds_secret(call, text), evidence)


def _target_in(item: Locator, spec: Any) -> Locator:
    return _locate(item, spec if isinstance(spec, dict) else {"selector": spec})


def _spec_words(spec: Any) -> str:
    if isinstance(spec, str):
        return repr(spec)
    if isinstance(spec, dict):
        for key in TARGET_KEYS:
            if key in spec:
                extra = f" named {spec['name']!r}" if key == "role" and spec.get("name") else ""
                return f"{key} {spec[key]!r}{extra}"
    return "the target"


_DESCRIBE_JS = """e => {
    const attr = n => e.getAttribute(n) || undefined;
    const label = e.labels && e.labels.length ? e.labels[0].innerText.trim() : undefined;
    return {tag: e.tagName.toLowerCase(), id: e.id || undefined, name: attr('name'), type: attr('type'),
            role: attr('role'), ariaLabel: attr('aria-label'), label: label,
            autocomplete: attr('autocomplete'), placeholder: attr('placeholder'),
            text: (e.innerText || e.value && e.type === 'submit' && e.value || '').trim().slice(0, 200) || undefined};
}"""
# Playwright's own test of "visible": styled visible, and a box that is not empty.
_SHOWN_JS = """e => {
    const box = e.getBoundingClientRect();
    const visible = (!e.checkVisibility || e.checkVisibility()) && getComputedStyle(e).visibility !== 'hidden'
        && box.width > 0 && box.height > 0;
    return {visible, element: (DESCRIBE)(e)};
}""".replace("DESCRIBE", _DESCRIBE_JS)


def describe(target: Locator) -> dict[str, Any]:
    """The element a step chose: tag, role, accessible name, text, and the attributes that
    identify it (never a field's value)."""
    info: dict[str, Any] = target.evaluate(_DESCRIBE_JS)
    return {k: v for k, v in info.items() if v is not None}


def _target_described(call: Call, spec: Any) -> tuple[Locator, dict[str, Any]]:
    """``_target`` and ``describe`` of the first element ``spec`` names: one call to the page
    when that element is there and visible (as it is for most steps; ``evaluate_all`` neither
    waits nor holds a handle); otherwise waiting for it as ``_target`` does."""
    locator = _locator(call, spec).first
    try:
        found = locator.evaluate_all(f"els => els.length ? ({_SHOWN_JS})(els[0]) : null")
    except PlaywrightError:
        found = None  # the page changed under the call (a navigation): wait for it as usual
    if isinstance(found, dict) and found.get("visible"):
        return locator, {k: v for k, v in found["element"].items() if v is not None}
    target = _waited(call, spec, locator, visible=True)
    return target, describe(target)


def _visible_text(item: Locator) -> str:
    text: str = item.evaluate("e => (e.innerText || e.textContent || '').trim()")
    return re.sub(r"[ \t]+", " ", text)


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _price(item: Locator, text: str, price_selector: Any) -> float | None:
    if price_selector:
        found = _target_in(item, price_selector)
        text = _visible_text(found.first) if found.count() else ""
    match = _NUMBER.search(text)
    if not match:
        return None
    try:
        return float(match.group().replace(",", ""))
    except ValueError:
        return None


# -- secrets and payment -------------------------------------------------------------------------
def _holds_secret(call: Call, text: str) -> bool:
    if not text:
        return False
    secrets = [str(v) for v in call.ctx.facts.secrets().values() if str(v)]
    return any(s in text for s in secrets) or looks_like_card(text)


def _mode(call: Call) -> str:
    return str(call.ctx.task.constraints.get("payment", "stop_at_payment"))


def _guard_payment_click(call: Call, target: Locator, element: dict[str, Any], evidence: Evidence) -> None:
    """In front of a control that pays: stop (``stop_at_payment``), or ask the owner and press
    only with their OK (``fill_then_approve``)."""
    signals = payment.stops_before(call.page, element)
    if signals is None:
        return
    stop_before_paying(call, signals, element, evidence)


def stop_before_paying(call: Call, signals: list[str], element: dict[str, Any], evidence: Evidence) -> None:
    """The page would pay if the step acted (``signals`` say why): stop (``stop_at_payment``), or
    ask the owner and go on only with their OK (``fill_then_approve``)."""
    here = origins.origin_of(call.page.url)
    label = element.get("text") or element.get("ariaLabel") or "the control that pays"
    evidence.data["payment"] = signals
    if _mode(call) != "fill_then_approve":
        raise PaymentStop(f"a payment page on {here} ({', '.join(signals)}): paying is for a person; "
                          f"this task stops in front of '{label}'", evidence)
    if not origins.named(call.page.url, call.ctx.task.constraints):
        raise StepFailed(f"{here} is not named in constraints.origins; the box pays only where the caller said")
    if call.approved:
        return
    raise NeedsApproval(ApprovalKind.PAYMENT, f"press '{label}' on {here} to pay",
                        guard={"kind": "click", "origin": here},
                        detail={"action": "pay", "origin": here, "url": call.page.url, "control": element, "signals": signals})


def _guard_payment_fill(call: Call, element: dict[str, Any], text: str, secret: bool, evidence: Evidence) -> None:
    """Card data (a card field, or a card-looking number in any field) is typed only in
    ``fill_then_approve``, and only on an origin the caller named. Another secret (a password)
    stops only on a page with card fields or a payment provider's frame."""
    if not text:
        return
    card = looks_like_card(text) or payment.looks_like_card_field(element)
    if not card:
        if not secret:
            return
        paying = [s for s in payment.page_signals(call.page) if "card" in s or "frame" in s]
        if not paying:
            return
        evidence.data["payment"] = paying
    here = origins.origin_of(call.page.url)
    if _mode(call) != "fill_then_approve":
        raise PaymentStop(f"card details on {here}: the box types no card details in stop_at_payment; a person pays", evidence)
    if not origins.named(call.page.url, call.ctx.task.constraints):
        raise StepFailed(f"{here} is not named in constraints.origins: card details are typed only on the sites the caller named")


def _record_blocked(call: Call, url: str) -> None:
    call.session.blocked.append({"url": url[:500], "origin": origins.origin_of(url), "reason": "not in constraints.origins",
                                 "via": "browser"})


def record_dialogs(ctx: RunContext, session: BrowserSession) -> None:
    """Log the dialogs dismissed because no step said how to answer them (on the worker's thread)."""
    for dialog in pages.watch_of(session).unexpected():
        ctx.recorder.note(f"an unexpected {dialog['type']} was dismissed: {dialog['message'][:200]}",
                          {"dialog": dialog})


def record_blocked(ctx: RunContext, session: BrowserSession) -> None:
    """Log the pages the browser refused since the last call (on the worker's thread)."""
    for blocked in session.take_blocked():
        ctx.recorder.event(EventKind.BLOCKED_CONNECTION, f"blocked page {blocked['origin']}: {blocked['reason']}", blocked)

"""Finding an element from plain words (``{"describe": "the cheapest flight's Select button"}``).

The model picks one element from the page's candidates (interactive elements, each with its role,
name, text and the text of the row it sits in); the choice is recorded with its prompt and
decision, and pinned as a selector that names the element by its role and accessible name
(within its row when the name alone is not unique), a CSS path only when nothing else is, beside
the element's fingerprint (``_FINGERPRINT``).

What worked is remembered per instruction and page (origin and path): hints the flow brings
(``flow.memory``, from an earlier run's report), replayed when they still find exactly one
visible element, and the box's own cache (``tasks.browser.cache``), replayed only when the
element its selector finds, alone, still has the fingerprint it had. An instruction that depends
on the page's data (the cheapest, the newest, a date) is grounded by the model every time. What
the model found is written to the cache only after the action on it succeeded
(``Grounded.confirm``). Model calls and the database happen on the worker's thread (they write to
the log); page work on the browser's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from tasks.browser import cache
from tasks.browser.session import BrowserSession
from tasks.llm.client import ModelError, NoModel
from tasks.run.evidence import StepFailed, bounded
from tasks.workers.asking import ask_model

if TYPE_CHECKING:
    from tasks.models import Task
    from tasks.run.context import RunContext

MAX_CANDIDATES = 200
REF = "data-box-ref"
_SCHEMA = {"type": "object", "properties": {"ref": {"type": "integer"}, "why": {"type": "string"}}, "required": ["ref"]}
_SYSTEM = ("You choose the one element of a web page that a step of a task must act on. You get the step, the "
           "instruction in plain words and the page's elements, each as [ref] role \"name\" and the text around it. "
           "Answer with the ref of the element that fits the instruction.")
# What an element is, as far as a replay must agree: its role (explicit, else the one its tag
# implies), accessible name, own text, label, the text of the row it sits in (a list item, a
# table row, a card: else the nearest ancestor that says more than the element) and the heading
# above it. A CSS path finds the second item of a list whatever it holds now; the row's text
# tells the Play flight's button from the Air flight's.
_FINGERPRINT = """e => {
    const norm = s => (s || '').replace(/\\s+/g, ' ').trim();
    const tag = e.tagName.toLowerCase();
    const type = (e.getAttribute('type') || '').toLowerCase();
    const implied = () => {
        if (tag === 'button' || (tag === 'input' && ['button', 'submit', 'reset', 'image'].includes(type))) return 'button';
        if (tag === 'a' && e.hasAttribute('href')) return 'link';
        if (tag === 'select') return e.multiple || e.size > 1 ? 'listbox' : 'combobox';
        if (tag === 'textarea') return 'textbox';
        if (tag === 'input') {
            if (type === 'checkbox' || type === 'radio') return type;
            if (type === 'search') return 'searchbox';
            if (type === 'number') return 'spinbutton';
            if (['', 'text', 'email', 'tel', 'url'].includes(type)) return 'textbox';
        }
        return '';
    };
    const role = norm(e.getAttribute('role')).split(' ')[0] || implied();
    const by = (e.getAttribute('aria-labelledby') || '').split(/\\s+/).map(id => id && document.getElementById(id))
        .filter(Boolean).map(n => n.innerText).join(' ');
    const label = e.labels && e.labels.length ? norm(Array.from(e.labels).map(l => l.innerText).join(' ')) : '';
    const own = norm(e.innerText || (tag === 'input' && ['button', 'submit', 'reset'].includes(type) ? e.value : ''));
    const name = norm(e.getAttribute('aria-label') || by || label || own || e.getAttribute('title') || e.getAttribute('alt')
                      || e.getAttribute('placeholder')).slice(0, 200);
    let row = e.closest('li, tr, article, [role=row], [role=listitem], [role=option], [role=article]');
    if (!row) {
        row = e.parentElement;
        while (row && row !== document.body && norm(row.innerText) === own) row = row.parentElement;
    }
    const rowText = row && row !== document.body && row !== document.documentElement ? norm(row.innerText).slice(0, 300) : '';
    let heading = '';
    for (const h of document.querySelectorAll('h1, h2, h3, h4, h5, h6, [role=heading]')) {
        if (h !== e && !h.contains(e) && (h.compareDocumentPosition(e) & Node.DOCUMENT_POSITION_FOLLOWING)) heading = norm(h.innerText).slice(0, 200);
    }
    return {tag, role, name, text: own.slice(0, 200), label: label.slice(0, 200), row: rowText, heading};
}"""


def page_key(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


@dataclass
class Grounded:
    """A ``describe`` target found: the step's value with a ``selector`` in its place, how it was
    found (the step result's ``grounding``), and what the cache learns once the action succeeded."""

    value: dict[str, Any]
    shown: dict[str, Any]
    instruction: str
    url: str
    kind: str
    fingerprint: dict[str, Any] | None = None  # the model chose it: remembered after the action
    entry: int | None = None  # replayed from this cache entry: its use is counted after the action

    def confirm(self, task: Task) -> None:
        """The action on the element succeeded: only now does the cache keep (or count) it."""
        if self.fingerprint is not None:
            cache.remember(task, self.url, self.instruction, kind=self.kind, selector=str(self.value["selector"]),
                           fingerprint=self.fingerprint)
        elif self.entry is not None:
            cache.record_use(self.entry, task)


def ground(ctx: RunContext, session: BrowserSession, kind: str, value: dict[str, Any], *, index: int,
           timeout_s: float, trace: bool = False) -> Grounded:
    """``value`` with ``describe`` replaced by a ``selector``, how it was found (for the log), and
    what to remember once the step's action succeeded."""
    instruction = str(value["describe"])
    rest = {k: v for k, v in value.items() if k != "describe"}
    url = session.call(lambda: session.page.url)
    page = page_key(url)
    base = {"instruction": instruction, "page": page}
    blank = Grounded({}, {}, instruction, url, kind)

    def found(selector: str, shown: dict[str, Any], **learned: Any) -> Grounded:
        return replace(blank, value={**rest, "selector": selector}, shown=shown, **learned)

    fresh = cache.depends_on_data(instruction)
    gone: list[str] = []
    checked: list[dict[str, str]] = []
    if fresh is None:
        memory = [m for m in (ctx.task.flow or {}).get("memory", []) if isinstance(m, dict)]
        hints = [str(m["selector"]) for m in memory
                 if m.get("instruction") == instruction and m.get("selector") and m.get("page") in (None, page)]
        for selector in hints:
            if session.call(lambda s=selector: _unique(session.page, s, timeout_s)):  # type: ignore[misc]
                return found(selector, {**base, "from": "memory", "selector": selector})
            gone.append(selector)
        entry = cache.find(ctx.task, url, instruction)
        if entry is not None:
            now = session.call(lambda: _fingerprint_of(session.page, entry.selector, timeout_s))
            why = _mismatch(entry.fingerprint, ctx.recorder.redactor.redact(now) if isinstance(now, dict) else now)
            if why is None:
                return found(entry.selector, {**base, "from": "cache", "selector": entry.selector}, entry=entry.pk)
            gone.append(entry.selector)
            checked.append({"selector": entry.selector, "why": why})
    candidates, title = session.call(lambda: _candidates(session.page))
    if not candidates:
        raise StepFailed(f"nothing on the page to choose '{instruction}' from")
    lines = "\n".join(_line(c) for c in candidates)
    prompt = (f"Step: {kind}\nInstruction: {instruction}\nPage: {title} ({url})\nElements:\n{lines}")
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
    shown = {**base, "prompt": bounded(ctx.recorder.redactor.text(prompt), chars=4000),
             **({"forgotten": gone} if gone else {}), **({"checked": checked} if checked else {}),
             **({"fresh": f"the instruction depends on the page's data ('{fresh}'): not replayed"} if fresh else {})}
    try:
        decision, answer = ask_model(ctx, messages, purpose=f"step {index + 1}: find '{instruction}'", schema=_SCHEMA)
    except NoModel as exc:
        raise StepFailed(f"'describe' needs a model to find the element: {exc}") from exc
    except ModelError as exc:
        raise StepFailed(f"the model could not find '{instruction}': {exc}") from exc
    ref = int(answer["ref"])
    if not any(c["ref"] == ref for c in candidates):
        raise StepFailed(f"the model chose element {ref}, which is not on the page")
    selector, fingerprint = session.call(lambda: _pin(session.page, ref, ctx.recorder.redactor.text))
    how = {**shown, "from": "model", "ref": ref, "why": answer.get("why"), "decision": decision.shown(), "selector": selector,
           "costCents": round(decision.cost_cents, 4)}
    if trace:  # the whole exchange, for the report (redacted where every event is written)
        how["trace"] = {"messages": messages, "answer": decision.content}
    # A data-dependent instruction is never replayed, so it is not kept either.
    kept = None if fresh else ctx.recorder.redactor.redact(fingerprint)
    return found(selector, how, fingerprint=kept)


def _mismatch(kept: dict[str, Any], now: dict[str, Any] | str) -> str | None:
    """Why the element a remembered selector finds now is not the one remembered, or None."""
    if isinstance(now, str):
        return now
    for key in ("role", "name", "label", "text", "row", "heading", "tag"):
        if str(kept.get(key, "")) != str(now.get(key, "")):
            return f"its {key} was '{kept.get(key, '')}', now '{now.get(key, '')}'"[:300]
    return None


def _fingerprint_of(page: Page, selector: str, timeout_s: float) -> dict[str, Any] | str:
    """The fingerprint of the one visible element ``selector`` finds, or why there is none."""
    try:
        locator = page.locator(selector)
        if locator.count() == 0:
            try:
                locator.first.wait_for(state="visible", timeout=min(timeout_s, 2) * 1000)
            except PlaywrightError:
                return "no element matches it"
        count = locator.count()
        if count != 1:
            return f"{count} elements match it" if count else "no element matches it"
        if not locator.is_visible():
            return "its element is hidden"
        found: dict[str, Any] = locator.evaluate(_FINGERPRINT)
        return found
    except PlaywrightError as exc:
        return f"it could not be read: {(exc.message or str(exc)).splitlines()[0][:200]}"


def _pin(page: Page, ref: int, redact: Any) -> tuple[str, dict[str, Any]]:
    """The selector to replay for the marked element ``ref``, and its fingerprint. The first of
    these that finds that element and no other: its role and name; its role and name within its
    row; its label; a CSS path. A name or row holding a secret is not written into a selector."""
    marked = page.locator(f"[{REF}=\"{ref}\"]")
    fingerprint: dict[str, Any] = marked.evaluate(_FINGERPRINT)
    row_tag: str = marked.evaluate("""e => {
        const row = e.closest('li, tr, article, [role=row], [role=listitem], [role=option], [role=article]');
        return row ? (row.getAttribute('role') ? `[role=${row.getAttribute('role')}]` : row.tagName.toLowerCase()) : '';
    }""")
    role, name, label, row = (str(fingerprint.get(k) or "") for k in ("role", "name", "label", "row"))
    tried: list[str] = []
    if role and name and redact(name) == name:
        by_role = f"role={role}[name={_quoted(name)} s]"
        tried.append(by_role)
        if row_tag and row and redact(row) == row:
            tried.append(f"{row_tag}:has-text({_quoted(row[:120])}) >> {by_role}")
    if label and redact(label) == label:
        tried.append(f"internal:label={_quoted(label)}s")
    for selector in tried:
        if _is_only(page, selector, ref):
            _unmark(page)
            return selector, fingerprint
    return _selector_for(page, ref), fingerprint


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_only(page: Page, selector: str, ref: int) -> bool:
    try:
        locator = page.locator(selector)
        return locator.count() == 1 and bool(locator.evaluate(f"e => e.getAttribute('{REF}') === '{ref}'"))
    except PlaywrightError:
        return False


def _unmark(page: Page) -> None:
    page.evaluate(f"() => {{ for (const m of document.querySelectorAll('[{REF}]')) m.removeAttribute('{REF}'); }}")


def _unique(page: Page, selector: str, timeout_s: float) -> bool:
    try:
        locator = page.locator(selector)
        if locator.count() != 1:
            locator.first.wait_for(state="visible", timeout=min(timeout_s, 2) * 1000)
        return locator.count() == 1 and locator.first.is_visible()
    except PlaywrightError:
        return False


def _candidates(page: Page) -> tuple[list[dict[str, Any]], str]:
    found: list[dict[str, Any]] = page.evaluate(
        """([mark, limit]) => {
            const picked = document.querySelectorAll('a[href], button, input, select, textarea, summary, [role], [onclick], [tabindex]');
            const out = [];
            for (const e of picked) {
                if (out.length >= limit) break;
                const box = e.getBoundingClientRect();
                if (!box.width || !box.height || getComputedStyle(e).visibility === 'hidden') continue;
                const row = e.closest('li, tr, article, section, form, [role=row], [role=listitem]') || e.parentElement;
                const label = e.labels && e.labels.length ? e.labels[0].innerText : '';
                const ref = out.length + 1;
                e.setAttribute(mark, String(ref));
                out.push({ref, tag: e.tagName.toLowerCase(), role: e.getAttribute('role') || '', type: e.getAttribute('type') || '',
                          name: (e.getAttribute('aria-label') || label || e.innerText || e.getAttribute('placeholder') || e.value || '').trim().slice(0, 80),
                          around: row ? row.innerText.replace(/\\s+/g, ' ').trim().slice(0, 160) : ''});
            }
            return out;
        }""",
        [REF, MAX_CANDIDATES],
    )
    return found, page.title()


def _line(candidate: dict[str, Any]) -> str:
    what = candidate["role"] or (f"{candidate['tag']}[{candidate['type']}]" if candidate["type"] else candidate["tag"])
    around = f" — in: {candidate['around']}" if candidate["around"] and candidate["around"] != candidate["name"] else ""
    return f"[{candidate['ref']}] {what} \"{candidate['name']}\"{around}"


def _selector_for(page: Page, ref: int) -> str:
    """A CSS path to the chosen element that does not depend on the box's own marks."""
    selector: str = page.evaluate(
        """([mark, ref]) => {
            let e = document.querySelector(`[${mark}="${ref}"]`);
            const parts = [];
            while (e && e.nodeType === 1 && e !== document.documentElement) {
                if (e.id && document.querySelectorAll('#' + CSS.escape(e.id)).length === 1) { parts.unshift('#' + CSS.escape(e.id)); break; }
                let part = e.tagName.toLowerCase();
                const same = Array.from(e.parentElement ? e.parentElement.children : []).filter(s => s.tagName === e.tagName);
                if (same.length > 1) part += `:nth-of-type(${same.indexOf(e) + 1})`;
                parts.unshift(part);
                e = e.parentElement;
            }
            for (const m of document.querySelectorAll(`[${mark}]`)) m.removeAttribute(mark);
            return parts.join(' > ');
        }""",
        [REF, ref],
    )
    return selector

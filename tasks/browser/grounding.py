"""Finding an element from plain words (``{"describe": "the cheapest flight's Select button"}``).

The model picks one element from the page's candidates (interactive elements, each with its role,
name, text and the text of the row it sits in); the choice is recorded with its prompt and
decision. What worked is remembered per instruction and page (origin and path): hints the flow
brings (``flow.memory``, from an earlier run's report) and the box's own cache
(``BOX_DATA_DIR/grounding.json``). A remembered selector that still finds exactly one visible
element is used with no model call; one that finds nothing is grounded again and replaced.
Model calls happen on the worker's thread (they write to the log); page work on the browser's.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.conf import settings
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from tasks.browser.session import BrowserSession
from tasks.llm.client import ModelError, NoModel
from tasks.run.evidence import StepFailed, bounded
from tasks.workers.asking import ask_model

if TYPE_CHECKING:
    from tasks.run.context import RunContext

MAX_CANDIDATES = 200
REF = "data-box-ref"
_SCHEMA = {"type": "object", "properties": {"ref": {"type": "integer"}, "why": {"type": "string"}}, "required": ["ref"]}
_SYSTEM = ("You choose the one element of a web page that a step of a task must act on. You get the step, the "
           "instruction in plain words and the page's elements, each as [ref] role \"name\" and the text around it. "
           "Answer with the ref of the element that fits the instruction.")
_cache_lock = threading.Lock()


def page_key(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def cache_path() -> Path:
    return Path(settings.BOX_DATA_DIR) / "grounding.json"


def _read_cache() -> dict[str, str]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def remembered(instruction: str, page: str) -> str | None:
    return _read_cache().get(f"{page}\n{instruction}")


def remember(instruction: str, page: str, selector: str) -> None:
    with _cache_lock:
        data = _read_cache()
        data[f"{page}\n{instruction}"] = selector
        path = cache_path()
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(data, indent=1))
        os.chmod(partial, 0o600)
        partial.replace(path)


def ground(ctx: RunContext, session: BrowserSession, kind: str, value: dict[str, Any], *, index: int,
           timeout_s: float, trace: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """``value`` with ``describe`` replaced by a ``selector``, and how it was found (for the log)."""
    instruction = str(value["describe"])
    rest = {k: v for k, v in value.items() if k != "describe"}
    url = session.call(lambda: session.page.url)
    page = page_key(url)
    memory = [m for m in (ctx.task.flow or {}).get("memory", []) if isinstance(m, dict)]
    hints = [("memory", str(m["selector"])) for m in memory
             if m.get("instruction") == instruction and m.get("selector") and m.get("page") in (None, page)]
    cached = remembered(instruction, page)
    if cached:
        hints.append(("cache", cached))
    gone: list[str] = []
    for source, selector in hints:
        if session.call(lambda s=selector: _unique(session.page, s, timeout_s)):  # type: ignore[misc]
            return {**rest, "selector": selector}, {"instruction": instruction, "page": page, "from": source, "selector": selector}
        gone.append(selector)
    candidates, title = session.call(lambda: _candidates(session.page))
    if not candidates:
        raise StepFailed(f"nothing on the page to choose '{instruction}' from")
    lines = "\n".join(_line(c) for c in candidates)
    prompt = (f"Step: {kind}\nInstruction: {instruction}\nPage: {title} ({url})\nElements:\n{lines}")
    messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
    shown = {"instruction": instruction, "page": page, "prompt": bounded(ctx.recorder.redactor.text(prompt), chars=4000),
             **({"forgotten": gone} if gone else {})}
    try:
        decision, answer = ask_model(ctx, messages, purpose=f"step {index + 1}: find '{instruction}'", schema=_SCHEMA)
    except NoModel as exc:
        raise StepFailed(f"'describe' needs a model to find the element: {exc}") from exc
    except ModelError as exc:
        raise StepFailed(f"the model could not find '{instruction}': {exc}") from exc
    ref = int(answer["ref"])
    if not any(c["ref"] == ref for c in candidates):
        raise StepFailed(f"the model chose element {ref}, which is not on the page")
    selector = session.call(lambda: _selector_for(session.page, ref))
    remember(instruction, page, selector)
    how = {**shown, "from": "model", "ref": ref, "why": answer.get("why"), "decision": decision.shown(), "selector": selector,
           "costCents": round(decision.cost_cents, 4)}
    if trace:  # the whole exchange, for the report (redacted where every event is written)
        how["trace"] = {"messages": messages, "answer": decision.content}
    return {**rest, "selector": selector}, how


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

"""A person steps in at a wall (docs/internals/browser.md#a-person-steps-in).

At a wall the run pauses with its browser kept (``BrowserSession.park``) on the page the wall is
on; the person passes it in the live view (``tasks.browser.screencast``) or, at a one-time-code
prompt, answers the inbox question with the code. The next run attaches to that browser and
goes on from the page as it is: the code (the task's sealed fact ``one_time_code``) is typed into
the field the wall showed and submitted, and the step that met the wall runs again there. A
``browse`` that met the wall is not opened again: the page it left is checked, and passes once
it no longer shows a wall.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from playwright.sync_api import Error as PlaywrightError

from tasks.browser import steps as browser_steps
from tasks.browser import walls
from tasks.run.evidence import Evidence, StepFailed

if TYPE_CHECKING:
    from tasks.browser.session import BrowserSession
    from tasks.run.context import RunContext

log = logging.getLogger(__name__)

CODE_FACT = "one_time_code"  # a sensitive name: the answer is sealed and redacted like any secret
CODE_TIMEOUT_MS = 10_000
ONE_TIME_CODE = "a one-time-code prompt"


def at_wall(session: BrowserSession | None, wall: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the pause at ``wall`` keeps for the next run (``resume["wall"]``), and the fields its
    inbox question asks: at a one-time-code prompt with a field to type into, the code
    (optional: a person who typed it in the live view leaves it empty)."""
    if session is None or not session.started:
        return {}, []
    field = None
    if wall == ONE_TIME_CODE:
        try:
            field = session.call(lambda: walls.code_field(session.page))
        except PlaywrightError:
            field = None
    resume = {"wall": {"kind": wall, **({"field": field} if field else {})}}
    if field is None:
        return resume, []
    return resume, [{"name": CODE_FACT, "kind": "text", "options": [], "optional": True,
                     "why": "the code the site sent: the box types it into the page's code field and submits it "
                            "(leave it empty if you typed it in the live view)"}]


def past_wall(ctx: RunContext, session: BrowserSession, kind: str, wall: dict[str, Any]) -> tuple[Any, Evidence] | None:
    """In the run after a wall, on the kept page: type the code the owner gave (if any), then,
    for a ``browse``, its result from the page as it is (``StepFailed`` while it still shows a
    wall); None for another step, which runs again as it is."""
    code = str(ctx.facts.values.get(CODE_FACT) or "")
    field = wall.get("field")
    if code and isinstance(field, str):
        try:
            session.call(lambda: _type_code(session, field, code))
        except PlaywrightError as exc:
            raise StepFailed(f"the one-time code could not be typed into the page's field ({field}): "
                             f"{str(exc.message).splitlines()[0][:300]}") from exc
        ctx.recorder.note("typed the one-time code into the field the wall showed, and submitted it",
                          {"browser": True, "field": field})
    if kind != "browse":
        return None

    def check() -> tuple[str | None, str, dict[str, Any]]:
        page = session.page
        text = browser_steps.page_text(page)
        return walls.looks_like_human_wall(text), text, {"url": page.url, "title": page.title()}

    still, text, where = session.call(check)
    if still:
        raise StepFailed(f"the page still shows {still}", page_text=text, evidence=Evidence({**where, "kept": True}))
    return where, Evidence({**where, "kept": True})


def _type_code(session: BrowserSession, field: str, code: str) -> None:
    target = session.page.locator(field).first
    target.fill(code, timeout=CODE_TIMEOUT_MS)
    target.press("Enter", timeout=CODE_TIMEOUT_MS)

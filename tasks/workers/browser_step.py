"""The flow's browser steps (``tasks.browser.kinds``): one browser session for the run, started
by its first browser step; a target described in plain words found on the page first."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tasks.browser import kinds as browser_kinds
from tasks.run.context import RunContext
from tasks.run.evidence import Evidence, StepFailed
from tasks.spec.flows import step_kind
from tasks.tools.registry import NeedsApproval
from tasks.workers.values import substitute

if TYPE_CHECKING:
    from tasks.browser.grounding import Grounded
    from tasks.browser.session import BrowserSession


class RunBrowser:
    """A flow run's browser: the session its browser steps share, kept for the next run when
    the run pauses (a wall, a payment, any other pause)."""

    def __init__(self) -> None:
        self._session: BrowserSession | None = None

    def release(self, paused: bool) -> None:
        """The run is over: its browser (if a step started one) is closed, except at a pause
        (``paused``), which keeps it on its page (``BrowserSession.park``) for a person to look
        at and drive, until the next run attaches to it, it sits idle too long, the task is
        cancelled or it ends."""
        if self._session is None:
            return
        if paused:
            self._session.park()
        else:
            self._session.close()
        self._session = None

    def execute(self, ctx: RunContext, kind: str, value: Any, step: dict[str, Any], *, known: dict[str, Any],
                approved: bool, index: int) -> tuple[Any, Evidence]:
        """Run browser step ``index`` in the run's session; its result and evidence."""
        from tasks.browser import actions  # noqa: PLC0415 - Playwright: only for a browser step

        session = self.session(ctx, index, known)
        wall = ctx.resume.get("wall") if ctx.resume.get("step") == index else None
        if isinstance(wall, dict) and session.attached is not None:
            from tasks.browser import stepin  # noqa: PLC0415 - as above

            passed = stepin.past_wall(ctx, session, kind, wall)
            if passed is not None:
                return passed
        value, grounded = ground_target(ctx, session, kind, value, step, index)
        try:
            result, evidence = actions.execute(ctx, session, kind, value, step, index=index, approved=approved)
        except StepFailed as exc:
            if grounded:
                exc.evidence.data["grounding"] = grounded.shown
            raise
        if grounded:
            grounded.confirm(ctx.task)  # the action succeeded: only now is what was found kept
            evidence.data["grounding"] = grounded.shown
        return result, evidence

    def at_wall(self, wall: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The pause at a wall: what its resume keeps (the wall, the code field it showed) and
        the fields its question asks (``tasks.browser.stepin.at_wall``)."""
        if self._session is None:
            return {}, []
        from tasks.browser import stepin  # noqa: PLC0415 - Playwright: only for a flow with a browser step

        return stepin.at_wall(self._session, wall)

    def session(self, ctx: RunContext, index: int, known: dict[str, Any]) -> BrowserSession:
        """The run's browser session, started by the first browser step. A run after a pause
        attaches to the browser that pause kept, on the page as it was. Any
        other run that starts in the middle of the flow (a retry, a kept browser gone) opens a fresh
        browser, so it first re-opens the page: the steps since the last ``browse`` run again,
        without evidence."""
        from tasks.browser.session import BrowserSession  # noqa: PLC0415 - Playwright: only for a flow with a browser step

        if self._session is None:
            self._session = BrowserSession(ctx)
        if self._session.started:
            return self._session
        if self._session.attach():
            ctx.recorder.note("browser kept from the pause: same page, nothing replayed", {"browser": True, "kept": True})
            return self._session
        self._session.start()
        ctx.recorder.note(f"browser started in {self._session.started_ms} ms", {"browser": True, "startMs": self._session.started_ms})
        steps: list[dict[str, Any]] = (ctx.task.flow or {}).get("steps", [])
        if index >= len(steps):  # the agent's browser calls: the agent opens the page again itself
            return self._session
        opened = [i for i in range(index) if step_kind(steps[i]) == "browse"]
        if step_kind(steps[index]) == "browse" or not opened:
            return self._session
        from tasks.browser import actions  # noqa: PLC0415 - as above

        replay = [i for i in range(opened[-1], index) if step_kind(steps[i]) in browser_kinds.ACTING]
        ctx.recorder.note(f"re-opening the page: steps {', '.join(str(i + 1) for i in replay)} again",
                          {"browser": True, "replayed": [i + 1 for i in replay]})
        for i in replay:
            kind = step_kind(steps[i])
            try:
                value, _ = ground_target(ctx, self._session, kind, substitute(steps[i][kind], known), steps[i], i)
                actions.execute(ctx, self._session, kind, value, steps[i], index=i, approved=False, replay=True)
            except (StepFailed, browser_kinds.PaymentStop, NeedsApproval) as exc:
                raise StepFailed(f"re-opening the page failed at step {i + 1}: {exc}") from exc
        return self._session


def ground_target(ctx: RunContext, session: BrowserSession, kind: str, value: Any, step: dict[str, Any],
                  index: int) -> tuple[Any, Grounded | None]:
    """A target described in plain words becomes a selector (``tasks.browser.grounding``);
    the step's value, and how it was found."""
    if not (isinstance(value, dict) and "describe" in value) or kind == "extract":  # an extract's describe is read by the model
        return value, None
    if kind not in ("click", "fill", "press", "select", "upload"):
        raise StepFailed(f"'describe' finds the element of a click, fill, press, select or upload step, not of a '{kind}' step")
    timeout_s = float(step.get("timeout_s") or browser_kinds.DEFAULT_TIMEOUT_S)
    from tasks.browser import grounding  # noqa: PLC0415 - Playwright: only for a browser step

    grounded = grounding.ground(ctx, session, kind, value, index=index, timeout_s=timeout_s,
                                trace=bool((ctx.task.flow or {}).get("trace")))
    return grounded.value, grounded

"""What the flow worker needs to know of the browser steps without loading Playwright: their
kinds, the default timeout and the pause in front of a payment. Playwright (a large part of the
memory of every process that imports it) is loaded by ``tasks.browser.steps`` only when a flow
has a browser step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.run.evidence import Evidence

# Acting steps store before/after evidence and run again when a fresh browser re-opens the page
# (``tab`` changes nothing out there, but the steps after it act on the tab it chose).
ACTING = ("browse", "click", "fill", "pick", "press", "select", "upload", "tab")
KINDS = (*ACTING, "wait", "extract", "screenshot")

DEFAULT_TIMEOUT_S = 15.0


class PaymentStop(Exception):
    """The flow reached a payment page under ``stop_at_payment``: a person pays, the task stops."""

    def __init__(self, message: str, evidence: Evidence) -> None:
        super().__init__(message)
        self.message = message
        self.evidence = evidence

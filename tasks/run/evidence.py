"""What a finished step did, in a bounded shape for the log (``step_result`` events).

Every step's result event carries ``step`` (1-based, the same number its summary, its start
event and the report use), ``kind``, ``ok``, ``startedAt``, ``durationMs`` and what the kind
produced: a ``run`` its exit code and the tail of its output (the whole output is an artifact),
a ``write``/``delete`` the path and size, an ``http`` call the method, URL, status and a bounded
body, a ``tool`` its arguments and result. Redaction happens where every event is written
(``tasks.events.record_event``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TAIL_LINES = 40
TAIL_CHARS = 4000
BODY_CHARS = 2000


@dataclass
class Evidence:
    """What a step did: the fields of its result event and the artifacts it carries."""

    data: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)


class StepFailed(Exception):
    """A step failed: the message, the text the failure showed (a page, a command's output: read
    for a wall only a person can pass) and what the step did before it failed."""

    def __init__(self, message: str, *, page_text: str = "", evidence: Evidence | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.page_text = page_text
        self.evidence = evidence or Evidence()


def tail(text: str, *, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    """The end of ``text``: at most ``lines`` lines and ``chars`` characters."""
    kept = text.splitlines()[-lines:]
    result = "\n".join(kept)
    if len(result) > chars:
        result = "…" + result[-chars:]
    return result


def bounded(value: Any, *, chars: int = BODY_CHARS) -> Any:
    """``value`` when its JSON form is short enough, else the start of that form as text."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + f"… ({len(value) - chars} more characters)"
    try:
        encoded = json.dumps(value, default=str)
    except (TypeError, ValueError):
        encoded = str(value)
    if len(encoded) <= chars:
        return value
    return encoded[:chars] + f"… ({len(encoded) - chars} more characters)"

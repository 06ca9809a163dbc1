"""Telling a wall only a person can pass (captcha, login, one-time code) from an ordinary failure."""
from __future__ import annotations

import re

_SIGNS = (
    ("a captcha", re.compile(r"captcha|i'?m not a robot|verify you are (a )?human|are you a robot", re.I)),
    ("a one-time-code prompt", re.compile(r"one[- ]time (pass)?code|verification code|\botp\b|enter the code (we|that we) sent|2fa|two[- ]factor", re.I)),
    ("a login form", re.compile(r"\b(sign|log) ?in to continue|please (sign|log) ?in|login required|<input[^>]+type=[\"']?password|enter your password", re.I)),
)


def looks_like_human_wall(text: str) -> str | None:
    """What kind of wall ``text`` shows, or None."""
    for label, pattern in _SIGNS:
        if pattern.search(text or ""):
            return label
    return None

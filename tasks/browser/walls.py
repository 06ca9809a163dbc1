"""Telling a wall only a person can pass (captcha, login, one-time code) from an ordinary failure.

Read from what a failed step showed (its message, a page's visible text, a command's output).
The signs are phrases a person is asked to act on, not words that merely appear in errors:
"password" alone is in countless error messages; "enter your password" is a login form.
"""
from __future__ import annotations

import re

_SIGNS = (
    ("a captcha", re.compile(
        r"captcha|i'?m not a robot|verify (that )?you are (a )?human|are you (a )?(human|robot)|"
        r"unusual traffic from your (computer|network)|checking (if the site connection is secure|your browser before)|"
        r"press (and|&) hold", re.I)),
    ("a one-time-code prompt", re.compile(
        r"one[- ]time (pass)?(code|word)|verification code|security code (we|that we) sent|\botp\b|"
        r"enter the (\d-digit )?code (we|that we) (sent|texted|emailed)|\b2fa\b|two[- ](factor|step) (authentication|verification)|"
        r"authenticator app", re.I)),
    ("a login form", re.compile(
        r"\b(sign|log) ?in to (continue|your account)|please (sign|log) ?in|(login|sign[- ]in) required|"
        r"you (must|need to) (be )?(sign|log)(ged)? ?in|session (has )?expired[,.;:]? please (sign|log) ?in|"
        r"<input[^>]+type=[\"']?password|enter your password", re.I)),
)


def looks_like_human_wall(text: str) -> str | None:
    """What kind of wall ``text`` shows ("a captcha", "a login form", ...), or None."""
    for label, pattern in _SIGNS:
        if pattern.search(text or ""):
            return label
    return None

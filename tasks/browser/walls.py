"""Telling a wall only a person can pass (captcha, login, one-time code) from an ordinary failure.

Read from what a failed step showed (its message, a page's visible text, a command's output).
The signs are phrases a person is asked to act on, not words that merely appear in errors:
"password" alone is in countless error messages; "enter your password" is a login form.

A browser step's page adds what its DOM and frames show (``page_marks``), each as a line the
signs below read: a captcha provider's frame (reCAPTCHA, hCaptcha, Turnstile), a field that asks
for a one-time code (``autocomplete="one-time-code"``) and a password field a person can see. A
page that says nothing in words but holds one of these is still a wall.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import Page

# The hosts a captcha's frame is served from.
CAPTCHA_HOSTS = ("google.com/recaptcha", "www.google.com/recaptcha", "recaptcha.net", "hcaptcha.com",
                 "challenges.cloudflare.com", "arkoselabs.com", "funcaptcha.com", "geo.captcha-delivery.com")
MAX_FRAMES = 20  # frames read for marks; a page with more is read in its first ones

_SIGNS = (
    ("a captcha", re.compile(
        r"captcha|i'?m not a robot|verify (that )?you are (a )?human|are you (a )?(human|robot)|"
        r"unusual traffic from your (computer|network)|checking (if the site connection is secure|your browser before)|"
        r"press (and|&) hold|<captcha frame", re.I)),
    ("a one-time-code prompt", re.compile(
        r"one[- ]time (pass)?(code|word)|verification code|security code (we|that we) sent|\botp\b|"
        r"enter the (\d-digit )?code (we|that we) (sent|texted|emailed)|\b2fa\b|two[- ](factor|step) (authentication|verification)|"
        r"authenticator app|<input autocomplete=one-time-code", re.I)),
    ("a login form", re.compile(
        r"\b(sign|log) ?in to (continue|your account)|please (sign|log) ?in|(login|sign[- ]in) required|"
        r"you (must|need to) (be )?(sign|log)(ged)? ?in|session (has )?expired[,.;:]? please (sign|log) ?in|"
        r"<input[^>]+type=[\"']?password|enter your password", re.I)),
)

# Run in each frame: the marks of a wall its DOM holds, and a selector for the field a one-time
# code goes in (the first visible one; by autocomplete, else by its name, id, label or placeholder).
_PROBE = """() => {
    const shown = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
        return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; };
    const marks = [];
    const inputs = Array.from(document.querySelectorAll('input'));
    if (inputs.some(e => e.type === 'password' && shown(e))) marks.push('<input type=password visible>');
    const coded = inputs.filter(e => (e.getAttribute('autocomplete') || '').split(/\\s+/).includes('one-time-code') && shown(e));
    if (coded.length) marks.push('<input autocomplete=one-time-code>');
    const named = /one.?time|otp|verification|passcode|security.?code|\\bcode\\b|2fa|totp/i;
    const words = e => [e.name, e.id, e.placeholder, e.getAttribute('aria-label'),
        e.labels && e.labels.length ? e.labels[0].innerText : ''].join(' ');
    const field = coded[0] || inputs.find(e => ['text', 'tel', 'number', ''].includes(e.type) && shown(e) && named.test(words(e)));
    let selector = null;
    if (field) {
        if (field.id) selector = '#' + CSS.escape(field.id);
        else if (field.name) selector = 'input[name="' + field.name.replace(/["\\\\]/g, '\\\\$&') + '"]';
        else selector = 'input >> nth=' + inputs.indexOf(field);
    }
    const frames = Array.from(document.querySelectorAll('iframe[src]')).slice(0, 50).map(f => f.src);
    return {marks, field: selector, frames};
}"""


def looks_like_human_wall(text: str) -> str | None:
    """What kind of wall ``text`` shows ("a captcha", "a login form", ...), or None."""
    for label, pattern in _SIGNS:
        if pattern.search(text or ""):
            return label
    return None


def captcha_host(url: str) -> str | None:
    """The captcha provider a frame's URL belongs to, or None."""
    bare = re.sub(r"^[a-z]+://", "", url.lower())
    for host in CAPTCHA_HOSTS:
        if bare.startswith(host) or f".{host}" in bare.split("?", 1)[0]:
            return host
    return None


def page_marks(page: Page) -> list[str]:
    """The wall marks of the page's DOM and frames, one line each (empty: none)."""
    marks: list[str] = []
    for frame in page.frames[:MAX_FRAMES]:
        host = captcha_host(frame.url)
        if host is not None:
            marks.append(f"<captcha frame {host}>")
            continue
        probed = _probe(frame)
        if probed is not None:
            marks.extend(probed["marks"])
            # A frame that never loaded (its host unreachable) still names its provider.
            marks.extend(f"<captcha frame {h}>" for h in map(captcha_host, probed["frames"]) if h is not None)
    return list(dict.fromkeys(marks))


def code_field(page: Page) -> str | None:
    """A selector for the field of the main frame a one-time code goes in, or None."""
    probed = _probe(page.main_frame)
    return None if probed is None else probed.get("field")


def _probe(frame: Any) -> dict[str, Any] | None:
    from playwright.sync_api import Error as PlaywrightError  # noqa: PLC0415 - Playwright: only with a page

    try:
        found: dict[str, Any] = frame.evaluate(_PROBE)
    except PlaywrightError:
        return None  # a frame gone or navigating: nothing to read in it now
    return found

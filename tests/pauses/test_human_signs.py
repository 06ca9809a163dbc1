"""The signs of a wall only a person can pass, and ordinary failures that are not one."""
from __future__ import annotations

import pytest

from tasks.browser.walls import looks_like_human_wall


@pytest.mark.parametrize(("text", "label"), [
    ("Please complete the reCAPTCHA below", "a captcha"),
    ("<div>I'm not a robot</div>", "a captcha"),
    ("Our systems have detected unusual traffic from your computer network", "a captcha"),
    ("Checking if the site connection is secure", "a captcha"),
    ("Enter the 6-digit code we sent to +91 ••••• 43210", "a one-time-code prompt"),
    ("Two-factor authentication required", "a one-time-code prompt"),
    ("Open your authenticator app", "a one-time-code prompt"),
    ("Please sign in to continue", "a login form"),
    ("Your session has expired. Please log in again", "a login form"),
    ('<form><input name="pw" type="password"></form>', "a login form"),
    ("You must be logged in to view this page", "a login form"),
])
def test_walls_are_recognised(text, label):
    assert looks_like_human_wall(text) == label


@pytest.mark.parametrize("text", [
    "exit 1: no such file or directory: config.yml",
    "Permission denied (publickey,password).",
    "authentication failed: bad token",
    "HTTP 500 internal server error",
    "error: password must be at least 8 characters",
    "",
])
def test_ordinary_failures_are_not_walls(text):
    assert looks_like_human_wall(text) is None

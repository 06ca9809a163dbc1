"""The one-time setup code that guards a fresh box's first visit (docs/guide/portal.md).

Until the box has an owner, whoever opens ``/setup`` first would become it, and a box listening
on the network is open to anyone there. So the box's start prints a code on its console and in its
log, and the setup page creates the owner only for someone who gives it: the person who started
the box. The data directory keeps only the code's SHA-256 (the code carries 60 random bits, so a
plain digest cannot be reversed by guessing); the code is spent when the owner is created.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from django.conf import settings

log = logging.getLogger("box.setup")

# No 0/O, 1/I: the code is read off a console and typed.
ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
LENGTH = 12


def _path() -> Path:
    return Path(settings.BOX_DATA_DIR) / "setup-code.sha256"


def _normal(code: str) -> str:
    return "".join(ch for ch in code.upper() if ch.isalnum())


def _digest(code: str) -> str:
    return hashlib.sha256(_normal(code).encode()).hexdigest()


def issue() -> str:
    """A new code, replacing any earlier one (each start of the box issues one while it has no
    owner). Logged at once; returned for the console."""
    raw = "".join(secrets.choice(ALPHABET) for _ in range(LENGTH))
    code = "-".join(raw[i:i + 4] for i in range(0, LENGTH, 4))
    path = _path()
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(_digest(code) + "\n")
    os.replace(partial, path)
    log.warning("setup code for the owner account: %s (the setup page asks for it; it is spent once the owner exists)", code)
    return code


def ensure_issued() -> None:
    """Issue a code unless one is pending: a web process started without ``runbox`` (daphne on
    its own) still guards its setup page, and its log has the code."""
    if not _path().exists():
        issue()


def matches(code: str) -> bool:
    try:
        stored = _path().read_text().strip()
    except FileNotFoundError:
        return False
    return bool(_normal(code)) and hmac.compare_digest(_digest(code), stored)


def spend() -> None:
    """The box has its owner: no code opens the setup page again."""
    _path().unlink(missing_ok=True)

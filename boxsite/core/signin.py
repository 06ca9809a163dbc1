"""Sign-in throttling, in Django's cache: failed attempts are counted per account from one
address, per address (any name) and per account (any address); reaching a limit refuses every
attempt it covers, right password or not, until the lock expires. The owner is told at their next
successful sign-in (and the log says so at once).

The default cache is per process, which is what the box runs (one web process). The client's
address is ``REMOTE_ADDR``, or behind a trusted proxy (``BOX_TRUSTED_PROXY``) the address that proxy appended last
to ``X-Forwarded-For`` (earlier entries are the client's to choose).
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest
from django.utils import timezone

log = logging.getLogger(__name__)

NOTICE_SECONDS = 30 * 24 * 3600


@dataclass(frozen=True)
class _Limit:
    scope: str  # what the counter covers: "pair" (account from address), "address", "account"
    factor: int  # times BOX_SIGNIN_MAX_FAILURES


LIMITS = (_Limit("pair", 1), _Limit("address", 4), _Limit("account", 10))


def client_address(request: HttpRequest) -> str:
    if settings.SECURE_PROXY_SSL_HEADER:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if forwarded.strip():
            return forwarded.split(",")[-1].strip()
    return str(request.META.get("REMOTE_ADDR", ""))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _subject(limit: _Limit, username: str, address: str) -> str:
    name = username.strip().lower()
    return {"pair": f"{name}\0{address}", "address": address, "account": name}[limit.scope]


def _keys(limit: _Limit, username: str, address: str) -> tuple[str, str]:
    subject = _digest(f"{limit.scope}\0{_subject(limit, username, address)}")
    return f"signin:failures:{subject}", f"signin:locked:{subject}"


def seconds_locked(username: str, address: str) -> int:
    """How long sign-in as ``username`` from ``address`` stays refused (0: not locked)."""
    now = time.time()
    until = max((cache.get(_keys(limit, username, address)[1]) or 0.0) for limit in LIMITS)
    return max(0, int(until - now + 0.999))


def record_failure(username: str, address: str) -> bool:
    """Count one failed attempt; True when it locked something."""
    window = settings.BOX_SIGNIN_LOCKOUT_SECONDS
    locked = False
    for limit in LIMITS:
        failures_key, lock_key = _keys(limit, username, address)
        cache.add(failures_key, 0, timeout=window)
        try:
            failures = cache.incr(failures_key)
        except ValueError:  # expired between add and incr
            cache.set(failures_key, 1, timeout=window)
            failures = 1
        if failures >= settings.BOX_SIGNIN_MAX_FAILURES * limit.factor and cache.add(lock_key, time.time() + window, timeout=window):
            cache.delete(failures_key)
            locked = True
            _note_lockout(username, address, limit.scope, failures)
    return locked


def _note_lockout(username: str, address: str, scope: str, failures: int) -> None:
    minutes = max(1, settings.BOX_SIGNIN_LOCKOUT_SECONDS // 60)
    log.warning("sign-in locked for %s minutes after %s failed attempts (%s; name %r, address %s)",
                minutes, failures, scope, username, address)
    notice = (f"Sign-in was locked for {minutes} minutes at {timezone.now():%Y-%m-%d %H:%M} UTC after "
              f"{failures} failed attempts (the last from {address or 'an unknown address'}). "
              "If that was not you, someone is guessing your password: choose a long one.")
    cache.set("signin:notice", notice, timeout=NOTICE_SECONDS)  # one owner: one notice to tell


def signed_in(username: str, address: str) -> str | None:
    """A successful sign-in: its own account-and-address count starts again. Returns the lockout
    notice to show the owner, once."""
    cache.delete(_keys(LIMITS[0], username, address)[0])
    notice = cache.get("signin:notice")
    if notice is not None:
        cache.delete("signin:notice")
    return notice

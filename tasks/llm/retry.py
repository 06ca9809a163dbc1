"""When to try a model call again, and how long to wait first.

Exponential backoff with full jitter from ``BOX_MODEL_RETRY_BASE_S``, a wait the endpoint asks
for with ``Retry-After`` (seconds or an HTTP date) taken as given, and two bounds:
``BOX_MODEL_RETRY_TRIES`` attempts in all and ``BOX_MODEL_RETRY_MAX_S`` seconds from the first
attempt to the start of the last.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from django.conf import settings

# Statuses an endpoint answers when it is busy or briefly broken; anything else 4xx is the
# request's fault and fails the same way when sent again.
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
# A 429 with these codes is an account out of credit, not a busy endpoint: waiting does not help.
FINAL_429_CODES = ("insufficient_quota", "billing_hard_limit_reached")


@dataclass(frozen=True)
class Policy:
    tries: int
    max_s: float
    base_s: float

    @classmethod
    def current(cls) -> Policy:
        return cls(tries=max(1, int(settings.BOX_MODEL_RETRY_TRIES)), max_s=float(settings.BOX_MODEL_RETRY_MAX_S),
                   base_s=float(settings.BOX_MODEL_RETRY_BASE_S))

    def wait_s(self, attempt: int, retry_after_s: float | None) -> float:
        """The pause before attempt ``attempt + 1``."""
        if retry_after_s is not None:
            return max(0.0, retry_after_s)
        return random.uniform(self.base_s / 2, self.base_s * 2 ** (attempt - 1))

    def next_wait(self, attempt: int, started: float, retry_after_s: float | None) -> float | None:
        """How long to wait before trying again, or ``None`` when the bounds say stop."""
        if attempt >= self.tries:
            return None
        wait = self.wait_s(attempt, retry_after_s)
        if time.monotonic() - started + wait > self.max_s:
            return None
        return wait


def retry_after_s(headers: Any) -> float | None:
    """The ``Retry-After`` header as seconds from now (``retry-after-ms`` first, as OpenAI sends
    it); ``None`` when absent or unreadable."""
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())

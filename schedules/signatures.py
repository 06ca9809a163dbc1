"""Webhook signature verification: HMAC-SHA256 of the raw request body, nothing else.

Two forms are accepted:

- GitHub's ``X-Hub-Signature-256: sha256=<hex>``, the HMAC of the body;
- the timestamped ``X-Box-Signature: t=<unix seconds>,v1=<hex>`` (``v1`` may repeat), the HMAC
  of ``"<t>.<body>"``. ``t`` must be within five minutes of now in either direction, which bounds
  how long a captured request can be replayed (deliveries already seen are refused separately).

Only the exact bytes received are signed: re-serialising the JSON changes them and fails. The
legacy SHA-1 header (``sha1=``) is never accepted. Every comparison is constant-time
(``hmac.compare_digest``) and every candidate secret is checked, so timing reveals nothing
about which secret or how many leading bytes matched.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GITHUB_HEADER = "X-Hub-Signature-256"
TIMESTAMPED_HEADER = "X-Box-Signature"
TOLERANCE_SECONDS = 300
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class SignatureError(Exception):
    """Why a request's signature does not verify (said to the sender: it names no secret)."""


@dataclass(frozen=True)
class Verified:
    scheme: str  # "sha256" or "timestamped"
    signature: str  # the hex that matched; a stand-in delivery id for timestamped requests
    timestamp: int | None = None


def sign(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_header(secret: str, body: bytes) -> str:
    return "sha256=" + sign(secret, body)


def timestamped_header(secret: str, body: bytes, timestamp: int) -> str:
    return f"t={timestamp},v1={sign(secret, str(timestamp).encode() + b'.' + body)}"


def _any_matches(expected: Sequence[str], offered: Sequence[str]) -> str | None:
    """The offered signature that matches one of ``expected``; checks every pair."""
    found: str | None = None
    for want in expected:
        for got in offered:
            if hmac.compare_digest(want.encode(), got.encode()):
                found = got
    return found


def _parse_timestamped(header: str) -> tuple[int, list[str]]:
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        value = value.lower() if key == "v1" else value
        if key == "t" and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif key == "v1" and _HEX64.match(value):
            signatures.append(value)
    if timestamp is None or not signatures:
        raise SignatureError(f"{TIMESTAMPED_HEADER} must look like 't=<unix seconds>,v1=<hex sha256>'")
    return timestamp, signatures


def verify(headers: Mapping[str, str], body: bytes, secrets: Sequence[str], *, now: float) -> Verified:
    """Check the request's signature against each valid secret, or raise ``SignatureError``.

    ``headers`` is looked up case-sensitively by the canonical names above, so pass a mapping
    that is case-insensitive (Django's ``request.headers`` is).
    """
    if not secrets:
        raise SignatureError("this webhook has no secret to verify with")
    stamped = headers.get(TIMESTAMPED_HEADER)
    if stamped:
        timestamp, offered = _parse_timestamped(stamped)
        if abs(now - timestamp) > TOLERANCE_SECONDS:
            raise SignatureError(f"the signature's timestamp is more than {TOLERANCE_SECONDS // 60} minutes from now")
        signed = str(timestamp).encode() + b"." + body
        match = _any_matches([sign(s, signed) for s in secrets], offered)
        if match is None:
            raise SignatureError("the signature does not match the body")
        return Verified("timestamped", match, timestamp)
    github = headers.get(GITHUB_HEADER)
    if not github:
        raise SignatureError(f"the request is not signed: send {GITHUB_HEADER} or {TIMESTAMPED_HEADER}")
    scheme, _, hexdigest = github.strip().partition("=")
    hexdigest = hexdigest.lower()
    if scheme != "sha256" or not _HEX64.match(hexdigest):
        raise SignatureError(f"{GITHUB_HEADER} must be 'sha256=<hex>'")
    match = _any_matches([sign(s, body) for s in secrets], [hexdigest])
    if match is None:
        raise SignatureError("the signature does not match the body")
    return Verified("sha256", match)

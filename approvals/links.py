"""Signed approve and deny links: what a phone's notification acts through, with no session.

A link is the box's signature (``django.core.signing``, keyed by the secret key, salted for this
use) over one approval, one decision, the phone it was sent to, a nonce and the time it was
made. It acts on that approval only, as that phone (so only on what the phone's inbox holds),
and only by POST: mail and chat clients fetch GETs on their own. It works once (the nonce is
spent with the decision, ``approvals.services.decide_by_link``), until it expires, and while the
approval is pending.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.core import signing

from boxsite.core.errors import Conflict, NotFound

SALT = "box.approval-link"
TTL = timedelta(hours=24)
DECISIONS = ("approve", "deny")
API_PATH = "/api/approval-links/"
PAGE_PATH = "/approval-links/"


@dataclass(frozen=True)
class Link:
    """What a valid link says: decide ``approval`` (``approve`` or not) as ``device``."""

    approval: int
    approve: bool
    device: int
    nonce: str


def sign(approval_id: int, decision: str, device_id: int) -> str:
    if decision not in DECISIONS:
        raise ValueError(f"not a decision: {decision}")
    claims = {"a": approval_id, "d": decision, "v": device_id, "n": secrets.token_urlsafe(12)}
    return signing.dumps(claims, salt=SALT)


def read(token: str) -> Link:
    """The link ``token`` is, or an error in the API's shape: a token the box did not sign (or
    one changed after) is unknown; an old one has expired."""
    try:
        claims = signing.loads(token, salt=SALT, max_age=TTL)
    except signing.SignatureExpired:
        raise Conflict("this link has expired; open the box to decide", field="token", code="LINK_EXPIRED") from None
    except signing.BadSignature:
        raise NotFound("this link is not one the box signed (or it was changed)", field="token") from None
    try:
        approval, decision, device, nonce = int(claims["a"]), claims["d"], int(claims["v"]), str(claims["n"])
    except (KeyError, TypeError, ValueError):
        raise NotFound("this link is not one the box signed", field="token") from None
    if decision not in DECISIONS:
        raise NotFound("this link is not one the box signed", field="token")
    return Link(approval=approval, approve=decision == "approve", device=device, nonce=nonce)


def api_url(token: str) -> str:
    """Where the phone's service worker POSTs (JSON, the error shape)."""
    return API_PATH + token


def page_url(token: str) -> str:
    """The same link as a page: a GET shows what it would do and a button that POSTs."""
    return PAGE_PATH + token

"""Who is on the other end of a WebSocket: a program's API token, a signed-in session or a
paired phone's cookie.

Tokens never travel in a WebSocket URL (query strings end up in logs and browser history): a
program sends its token as the API takes it, in an ``Authorization: Bearer`` header (which no
browser page can set on a WebSocket, so the portal's streams stay cookie-only), and a browser
authenticates exactly like the pages do: the session cookie, or the device cookie.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.conf import settings
from django.contrib.auth import get_user_model
from django.http.cookie import parse_cookie

from boxsite.core.auth import DEVICE_COOKIE, device_for, token_for
from boxsite.core.principal import Principal
from boxsite.models import ApiToken, Device


def _cookies(scope: dict[str, Any]) -> dict[str, str]:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            return parse_cookie(value.decode("latin-1"))
    return {}


class NulCookiesDropped(BaseMiddleware):
    """Outside the session middleware: a cookie whose value holds NUL is dropped before anything
    looks it up, as the HTTP edge does (``ApiEdgeMiddleware``); PostgreSQL refuses NUL in a
    query, and the session's lookup would end the connection with a server error, not a 4401."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = scope.get("headers", [])
        if any(name == b"cookie" and b"\x00" in value for name, value in headers):
            kept = [(name, b";".join(part for part in value.split(b";") if b"\x00" not in part) if name == b"cookie" else value)
                    for name, value in headers]
            scope = {**scope, "headers": kept}
        return await super().__call__(scope, receive, send)


class DeviceCookieMiddleware(BaseMiddleware):
    """Puts the paired ``Device`` (or None) into ``scope["device"]``. Sits inside the session
    middleware stack so a consumer sees both and can choose, as the API does (device first)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = dict(scope)
        raw = _cookies(scope).get(DEVICE_COOKIE)
        scope["device"] = await database_sync_to_async(device_for)(raw) if raw else None
        return await super().__call__(scope, receive, send)


class BearerTokenMiddleware(BaseMiddleware):
    """Puts the API token of an ``Authorization: Bearer`` header into ``scope["token"]``: the
    ``ApiToken``, False for a header naming no live token (refused, as the API refuses it), or
    None without one."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        scope = dict(scope)
        scope["token"] = None
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                parts = value.decode("latin-1").split()
                if parts and parts[0].lower() == "bearer":
                    found = await database_sync_to_async(token_for)(parts[1]) if len(parts) == 2 else None
                    scope["token"] = found or False
        return await super().__call__(scope, receive, send)


def principal_of_scope(scope: dict[str, Any]) -> Principal | None:
    """The principal a connection speaks for, or None when nobody signed in. A bearer token comes
    first, as in the API (``REST_FRAMEWORK``'s authentication order); a refused one is nobody."""
    token = scope.get("token")
    if token is False:
        return None
    if token is not None:
        return Principal.of_credential(token.user, token)
    device = scope.get("device")
    if device is not None:
        return Principal.phone(device)
    user = scope.get("user")
    if user is not None and user.is_authenticated:
        return Principal.session(user)
    return None


def signed_in(scope: dict[str, Any]) -> tuple[Principal, str | None] | None:
    """The connection's principal and its session's key (which ``still_signed_in`` re-checks
    while it streams), or None when nobody signed in."""
    principal = principal_of_scope(scope)
    if principal is None:
        return None
    session = scope.get("session")
    return principal, (session.session_key if session is not None else None)


def still_signed_in(principal: Principal, session_key: str | None) -> bool:
    """Re-check a connection's credentials against the database (sync; call in a thread).

    A revoked device, a deactivated user or a session that was signed out elsewhere ends the
    stream at the next check instead of streaming on with what was true at connect time.
    """

    if not get_user_model().objects.filter(pk=principal.user.pk, is_active=True).exists():
        return False
    if principal.token is not None:
        return ApiToken.objects.filter(pk=principal.token.pk, revoked_at__isnull=True).exists()
    if principal.device is not None:
        return Device.objects.filter(pk=principal.device.pk, revoked_at__isnull=True).exists()
    if not session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    return str(session.get("_auth_user_id")) == str(principal.user.pk)

"""How callers prove who they are: bearer tokens (programs), device cookies (paired phones),
and Django sessions (the owner's browser, with CSRF)."""
from __future__ import annotations

import secrets
from typing import Any, TypeVar

from django.utils import timezone
from rest_framework import authentication, exceptions

from boxsite.core import sql
from boxsite.models import ApiToken, Device, hash_key

DEVICE_COOKIE = "box_device"
TOKEN_PREFIX = "box_"
C = TypeVar("C", ApiToken, Device)


def new_token_value() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def issue_api_token(user: Any, name: str, *, can_use_folders: bool = False) -> tuple[ApiToken, str]:
    """Create a token; the raw value is returned once and never stored."""
    raw = new_token_value()
    token = ApiToken.objects.create(user=user, name=name, key_hash=hash_key(raw), prefix=raw[:10], can_use_folders=can_use_folders)
    return token, raw


def token_for(raw: str) -> ApiToken | None:
    token = _credential_with_user(ApiToken, raw)
    return token if token is not None and token.user.is_active else None


def device_for(raw: str) -> Device | None:
    device = _credential_with_user(Device, raw)
    return device if device is not None and device.user.is_active else None


def _credential_with_user(model: type[C], raw: str) -> C | None:
    """The unrevoked ``model`` row (a token, a device) whose key hashes as ``raw`` does, its user
    read with it (``sql.credential_with_user``)."""
    return sql.credential_with_user(model, hash_key(raw))


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken | Device] | None:
        raw = self.bearer(request)
        if raw is None:
            return None
        found = self.credential(raw)
        if found is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        return found

    def bearer(self, request: Any) -> str | None:
        """The token of an ``Authorization: Bearer <token>`` header; None without one."""
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if not parts or parts[0].lower() != self.keyword.lower():  # the scheme is case-insensitive (RFC 9110)
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("send 'Authorization: Bearer <token>'")
        return parts[1]

    def credential(self, raw: str) -> tuple[Any, ApiToken | Device] | None:
        token = token_for(raw)
        if token is None:
            return None
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class BearerTokenOrDeviceAuthentication(BearerTokenAuthentication):
    """An API token, or a paired phone's device token sent as the bearer (the MCP endpoint,
    ``boxsite.mcp``). A header is never sent by a browser on its own, so unlike the device's
    cookie it needs no CSRF token; the phone's limits follow from ``Principal.of_credential``."""

    def credential(self, raw: str) -> tuple[Any, ApiToken | Device] | None:
        found = super().credential(raw)
        if found is not None:
            return found
        device = device_for(raw)
        return None if device is None else (device.user, seen(device))


def seen(device: Device) -> Device:
    """Note that ``device`` was used (at most once a minute)."""
    now = timezone.now()
    if device.last_seen_at is None or (now - device.last_seen_at).total_seconds() > 60:
        Device.objects.filter(pk=device.pk).update(last_seen_at=now)
    return device


class DeviceCookieAuthentication(authentication.BaseAuthentication):
    """A paired phone's cookie. Unsafe methods still need the CSRF token, as for sessions."""

    def authenticate(self, request: Any) -> tuple[Any, Device] | None:
        raw = request.COOKIES.get(DEVICE_COOKIE)
        if not raw:
            return None
        device = device_for(raw)
        if device is None:
            return None
        authentication.SessionAuthentication().enforce_csrf(request)
        return device.user, seen(device)

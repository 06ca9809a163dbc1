"""Fixtures for the live streams: sessions and paired devices made through the front door, and
WebSocket clients speaking to the real ASGI application."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client
from rest_framework.test import APIClient

from boxsite.asgi import application
from boxsite.core.auth import DEVICE_COOKIE
from boxsite.settings import live_layer

ORIGIN = b"http://127.0.0.1:8000"


def session_cookie(user: Any, password: str = "a-long-password") -> str:
    """Sign in through the login page, as a browser would; returns the session cookie value."""
    client = Client()
    assert client.login(username=user.get_username(), password=password)
    return client.cookies["sessionid"].value


def pair_device(owner_api: APIClient, name: str = "Phone") -> str:
    """Pair a phone with a code from settings; returns the device cookie the box set."""
    code = owner_api.post("/api/pairing").json()["code"]
    phone = APIClient()
    response = phone.post("/api/pairing/claim", {"code": code, "name": name}, format="json")
    assert response.status_code == 201, response.json()
    return response.cookies[DEVICE_COOKIE].value


def ws(path: str, *, session: str | None = None, device: str | None = None, token: str | None = None,
       origin: bytes | None = ORIGIN) -> WebsocketCommunicator:
    headers = [(b"host", b"127.0.0.1:8000")]
    if origin is not None:
        headers.append((b"origin", origin))
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    cookies = []
    if session:
        cookies.append(f"sessionid={session}")
    if device:
        cookies.append(f"{DEVICE_COOKIE}={device}")
    if cookies:
        headers.append((b"cookie", "; ".join(cookies).encode()))
    return WebsocketCommunicator(application, path, headers=headers)


@pytest.fixture(params=["polling", "redis"])
def transport(request: Any, settings: Any) -> Iterator[str]:
    """Every stream test runs on the embedded polling transport and, with REDIS_URL, on Redis."""
    if request.param == "redis":
        url = os.environ.get("REDIS_URL")
        if not url:
            pytest.skip("set REDIS_URL to run the live streams over channels_redis")
        settings.CHANNEL_LAYERS = {"default": live_layer(url, prefix=f"box-test-{os.environ.get('BOX_QUEUE_NAME', 'box')}")}
    else:
        settings.CHANNEL_LAYERS = {}
    yield request.param

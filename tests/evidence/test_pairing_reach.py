"""The pairing answer says when a phone cannot reach the box, and a public URL fixes the QR code."""
from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings as django_settings

from boxsite.core import hostnames


def test_a_box_on_loopback_warns_that_a_phone_cannot_reach_it(box, settings):
    settings.BOX_HOST = "127.0.0.1"
    settings.BOX_PUBLIC_URL = ""
    body = box.api.post("/api/pairing").json()
    assert "phone cannot reach it" in body["reachWarning"]
    assert "BOX_HOST" in body["reachWarning"] and "BOX_PUBLIC_URL" in body["reachWarning"]


def test_a_box_on_the_network_opened_by_its_loopback_name_shows_a_reachable_address(box, settings):
    settings.BOX_HOST = "0.0.0.0"
    settings.BOX_PUBLIC_URL = ""
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "192.168.1.20"]
    body = box.api.post("/api/pairing", HTTP_HOST="localhost:8000", SERVER_PORT="8000").json()
    own = hostnames.own_addresses()
    if own:  # the QR code leads to this machine's own address, where the box listens too
        assert body["reachWarning"] is None
        assert body["url"].startswith(f"http://{hostnames.as_host(own[0])}:8000/pair?code=")
    else:  # a machine with no network address: nothing a phone could reach
        assert "opened as localhost" in body["reachWarning"]
    reachable = box.api.post("/api/pairing", HTTP_HOST="192.168.1.20").json()
    assert reachable["reachWarning"] is None and reachable["url"].startswith("http://192.168.1.20/pair?code=")


def test_a_public_url_is_what_the_qr_code_leads_to(box, settings):
    settings.BOX_HOST = "127.0.0.1"
    settings.BOX_PUBLIC_URL = "https://box.example.net"
    body = box.api.post("/api/pairing").json()
    assert body["reachWarning"] is None
    assert body["url"].startswith("https://box.example.net/pair?code=")


def test_a_malformed_public_url_stops_the_box_at_start_up():
    env = {**os.environ, "BOX_PUBLIC_URL": "box.example.net/some/path"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env={
        **env, "DJANGO_SETTINGS_MODULE": "boxsite.settings"}, capture_output=True, text=True,
        cwd=django_settings.BASE_DIR, check=False)
    assert done.returncode != 0 and "BOX_PUBLIC_URL" in done.stderr

"""Security headers: a Content-Security-Policy without inline script on every page and API
answer, and HSTS plus the proxy's TLS header in production mode."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import Client

from tests.conftest import Box

pytestmark = pytest.mark.django_db


def _directives(response: Any) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    return {part.split(" ", 1)[0]: part.split(" ", 1)[1] for part in header.split("; ")}


@pytest.mark.parametrize("path", ["/login", "/setup", "/api/health", "/api/docs/", "/nowhere"])
def test_every_answer_forbids_inline_and_foreign_script(path: str) -> None:
    response = Client().get(path)
    policy = _directives(response)
    assert policy["script-src"] == "'self'"  # no 'unsafe-inline', no 'unsafe-eval', no other origin
    assert policy["default-src"] == "'self'" and policy["object-src"] == "'none'"
    assert policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'"


def test_the_api_docs_page_has_no_inline_script(box: Box) -> None:
    html = box.api.get("/api/docs/").content.decode()
    assert "<script>" not in html.replace(" ", "")
    assert "<script src=" in html


def test_no_template_holds_inline_script_or_event_handlers() -> None:
    for template in Path(django_settings.BASE_DIR, "templates").rglob("*.html"):
        text = template.read_text()
        for line in text.splitlines():
            stripped = line.strip()
            if "<script" in stripped:
                assert "src=" in stripped or 'type="application/json"' in stripped, f"{template}: {stripped}"
            assert " onclick=" not in stripped and " onload=" not in stripped and " onsubmit=" not in stripped, template


def _production_settings(**env: str) -> dict[str, Any]:
    code = ("import django, json; django.setup(); from django.conf import settings as s; "
            "print(json.dumps({'hsts': s.SECURE_HSTS_SECONDS, 'proxy': s.SECURE_PROXY_SSL_HEADER}))")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=django_settings.BASE_DIR,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "boxsite.settings", "DJANGO_SECRET_KEY": "x" * 50,
                              **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_production_mode_sends_hsts_and_trusts_the_proxys_tls_header() -> None:
    assert _production_settings(BOX_PRODUCTION="1") == {"hsts": 31536000, "proxy": ["HTTP_X_FORWARDED_PROTO", "https"]}
    assert _production_settings(BOX_PRODUCTION="0") == {"hsts": 0, "proxy": None}
    assert _production_settings(BOX_PRODUCTION="1", BOX_HSTS_SECONDS="0")["hsts"] == 0


def test_hsts_goes_out_on_requests_the_proxy_says_came_over_https(settings: Any) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31536000
    over_tls = Client().get("/login", HTTP_X_FORWARDED_PROTO="https")
    assert over_tls["Strict-Transport-Security"] == "max-age=31536000"
    assert "Strict-Transport-Security" not in Client().get("/login")

"""The deployment files work with the tools they name: Caddy takes ``deploy/Caddyfile`` as it is
shipped, and in front of a server passes on what the box reads (the host, the scheme, the
client's address last, whatever a client claims)."""
from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, wait_for
from tests.http_server import Handler, serving

ROOT = Path(__file__).resolve().parent.parent
CADDYFILE = ROOT / "deploy" / "Caddyfile"
CADDY = shutil.which("caddy")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_caddy = pytest.mark.skipif(CADDY is None, reason="Caddy is not installed (.ci/run installs it)")


@needs_caddy
def test_the_shipped_caddyfile_is_one_caddy_takes(tmp_path: Path) -> None:
    done = subprocess.run([str(CADDY), "validate", "--adapter", "caddyfile", "--config", str(CADDYFILE)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]


class Echo(Handler):
    """Answers with the headers it was sent."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.reply(200, json.dumps({k.lower(): v for k, v in self.headers.items()}).encode(),
                   {"Content-Type": "application/json"})


@needs_caddy
def test_caddy_in_front_passes_the_host_the_scheme_and_the_clients_address_last(tmp_path: Path) -> None:
    port = free_port()
    with serving(Echo) as upstream:
        # The shipped site block, served over plain HTTP on a free port in front of the echo server.
        site = CADDYFILE.read_text().replace("box.example.net {", f"http://127.0.0.1:{port} {{", 1)
        site = site.replace("127.0.0.1:8000", f"127.0.0.1:{upstream}")
        config = tmp_path / "Caddyfile"
        config.write_text("{\n\tadmin off\n}\n\n" + site)
        caddy = subprocess.Popen([str(CADDY), "run", "--adapter", "caddyfile", "--config", str(config)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                                 env={**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)})
        try:
            def answered() -> Any:
                try:
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    connection.request("GET", "/api/health", headers={"X-Forwarded-For": "6.6.6.6"})
                    return json.loads(connection.getresponse().read())
                except (OSError, ValueError):
                    assert caddy.poll() is None, caddy.stderr.read().decode()[-2000:] if caddy.stderr else ""
                    return None
            seen = wait_for(answered, timeout=30, interval=0.1, what="Caddy to answer")
        finally:
            caddy.terminate()
            caddy.wait(timeout=30)
    assert seen["host"] == f"127.0.0.1:{port}"
    assert seen["x-forwarded-proto"] == "http"
    # The box takes the last address as the client's (BOX_TRUSTED_PROXY): a claimed one never is.
    assert [part.strip() for part in seen["x-forwarded-for"].split(",")][-1] == "127.0.0.1"


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_the_shipped_service_unit_is_one_systemd_takes(tmp_path: Path) -> None:
    """``deploy/box.service`` with this checkout and its Python where the unit expects ``/opt/box``."""
    unit = tmp_path / "box.service"
    text = (ROOT / "deploy" / "box.service").read_text().replace("/opt/box/.venv/bin/python", sys.executable)
    unit.write_text(text.replace("/opt/box", str(ROOT)))
    done = subprocess.run([str(SYSTEMD_ANALYZE), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "box.service" not in done.stderr, done.stderr[-2000:]

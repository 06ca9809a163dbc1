"""A box listening on the network answers requests addressed to this machine's own names and
addresses (a phone on the LAN opens it by them) and still refuses any other Host, with a log line
that names the setting to change. Through a real web process started as ``runbox`` starts it."""
from __future__ import annotations

import http.client
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boxsite.core import hostnames
from tests.cluster import spawn, stop
from tests.conftest import database_env, free_port, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _status(port: int, host: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/api/health", headers={"Host": host})
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.fixture
def web(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The web process of a box started with BOX_HOST=0.0.0.0 (bound to loopback here: the Host
    header, not the route, is what is checked)."""
    port = free_port()
    env = database_env()
    env.pop("BOX_ALLOWED_HOSTS", None)
    env.update({"BOX_HOST": "0.0.0.0", "BOX_PUBLIC_URL": "https://box.example.net"})
    log = tmp_path / "web.log"
    proc = spawn([sys.executable, "-m", "daphne",
                  "-b", "127.0.0.1", "-p", str(port), "boxsite.asgi:application"], env, log)

    def up() -> bool:
        try:
            return _status(port, "127.0.0.1") == 200
        except OSError:
            return False

    try:
        wait_for(up, timeout=60, what="the web process to answer")
        yield port, log
    finally:
        stop(proc, grace=5)


def test_a_box_on_the_network_answers_its_own_addresses_and_refuses_others(web: Any) -> None:
    port, log = web
    own = hostnames.own_addresses()
    if not own:
        pytest.skip("this machine has no address but loopback")
    for address in own:
        assert _status(port, f"{hostnames.as_host(address)}:{port}") == 200, address
    assert _status(port, socket.gethostname()) == 200
    assert _status(port, "box.example.net") == 200  # BOX_PUBLIC_URL's host

    assert _status(port, "evil.example") == 400
    wait_for(lambda: "BOX_ALLOWED_HOSTS" in log.read_text(), timeout=10, what="the hint in the web log")
    assert "evil.example" in log.read_text()

"""A task's network: nothing without hosts; with hosts, only them, through the egress proxy."""
from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator

import pytest

from tests.http_server import Handler, serving
from tests.sandbox.conftest import needs_sandbox, results

pytestmark = needs_sandbox


class _Hello(Handler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.reply(200, f"hello from the listed host {self.path}".encode())


@pytest.fixture
def host_server() -> Iterator[int]:
    """An HTTP service on the host's loopback (what a task must not reach unless it is listed)."""
    with serving(_Hello) as port:
        yield port


def host_address() -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=True).stdout
    return out.split()[3].split("/")[0] if out.strip() else "127.0.0.1"


PROBE = textwrap.dedent("""
    import os, socket, sys, http.client, urllib.request, urllib.error
    port, host_ip = int(sys.argv[1]), sys.argv[2]
    proxy = os.environ.get("HTTP_PROXY")
    print("proxy=%s" % proxy)
    for name in ("NO_PROXY", "no_proxy"):  # the listed IP here is loopback; go through the proxy anyway
        os.environ.pop(name, None)

    def get(url):
        handlers = [urllib.request.ProxyHandler({"http": proxy} if proxy else {})]
        try:
            with urllib.request.build_opener(*handlers).open(url, timeout=10) as r:
                return "ok %d %s" % (r.status, r.read().decode().strip())
        except urllib.error.HTTPError as e:
            return "refused %d %s" % (e.code, e.read().decode().strip())
        except OSError as e:
            return "error %s" % e

    def tunnel(host, tport):
        if not proxy:
            return "error no proxy"
        phost, pport = proxy.rsplit("/", 1)[-1].split(":")
        conn = http.client.HTTPConnection(phost, int(pport), timeout=10)
        conn.set_tunnel(host, tport)
        try:
            conn.request("GET", "/tunnel")
            r = conn.getresponse()
            return "ok %d %s" % (r.status, r.read().decode().strip())
        except OSError as e:
            return "error %s" % e

    def tcp(host, tport):
        try:
            socket.create_connection((host, tport), timeout=3).close()
            return "connected"
        except OSError as e:
            return "error %s" % e

    def unix(path):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(path)
            return "connected"
        except OSError as e:
            return "error %s" % e

    def udp(host, uport):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"\\x00" * 12, (host, uport))
            s.settimeout(2)
            s.recvfrom(512)
            return "answered"
        except OSError as e:
            return "error %s" % e

    def resolve(name):
        try:
            return "resolved %s" % socket.getaddrinfo(name, 80)[0][4][0]
        except OSError as e:
            return "error %s" % e

    checks = dict(
        listed=lambda: get("http://127.0.0.1:%d/hello" % port),
        listed_connect=lambda: tunnel("127.0.0.1", port),
        not_listed=lambda: get("http://not-listed.example/"),
        ip_literal=lambda: get("http://10.1.2.3/"),
        bracketed=lambda: get("http://[::1]:%d/" % port),
        loopback_name=lambda: get("http://localhost:%d/hello" % port),
        connect_not_listed=lambda: tunnel("evil.example", 443),
        direct_loopback=lambda: tcp("127.0.0.1", port),
        direct_host_ip=lambda: tcp(host_ip, port),
        postgres_tcp=lambda: tcp("127.0.0.1", 5432),
        redis_tcp=lambda: tcp("127.0.0.1", 6379),
        postgres_unix=lambda: unix("/run/postgresql/.s.PGSQL.5432"),
        postgres_unix_var=lambda: unix("/var/run/postgresql/.s.PGSQL.5432"),
        udp_out=lambda: udp("8.8.8.8", 53),
        udp_host=lambda: udp(host_ip, 53),
        dns=lambda: resolve("example.com"),
    )
    for name, check in checks.items():
        print("%s=%s" % (name, check()))
""")


def _probe(box, port: int, hosts: list[str] | None) -> tuple[dict, dict[str, str]]:
    spec = {"hosts": hosts} if hosts is not None else {}
    task = box.create(title="network probe", prompt="p", worker="command",
                      command=["/usr/bin/python3", "-c", PROBE, str(port), host_address()], **spec)
    view = box.wait_state(task["id"], "done", "failed")
    return view, results(box, view["id"])


def _unreachable(seen: dict[str, str], *names: str) -> None:
    for name in names:
        assert seen[name].startswith("error"), (name, seen[name])


def test_a_task_without_hosts_has_no_network_at_all(sandboxed, host_server):
    view, seen = _probe(sandboxed, host_server, None)
    assert view["state"] == "done", (view, seen)
    assert seen["proxy"] == "None"
    _unreachable(seen, "listed", "direct_loopback", "direct_host_ip", "postgres_tcp", "redis_tcp", "postgres_unix",
                 "postgres_unix_var", "udp_out", "udp_host", "dns")
    assert not [e for e in sandboxed.events(view["id"]) if e["kind"] == "blocked_connection"]


def test_a_listed_host_works_through_the_proxy_and_nothing_else_does(sandboxed, host_server):
    view, seen = _probe(sandboxed, host_server, ["127.0.0.1"])
    assert view["state"] == "done", (view, seen)
    assert seen["proxy"] == "http://127.0.0.1:3128"
    assert seen["listed"] == "ok 200 hello from the listed host /hello"
    assert seen["listed_connect"] == "ok 200 hello from the listed host /tunnel"
    for name in ("not_listed", "ip_literal", "bracketed", "loopback_name"):
        assert seen[name].startswith("refused 403"), (name, seen[name])
    assert seen["connect_not_listed"].startswith("error") and "403" in seen["connect_not_listed"]
    # Direct connections have no route, whatever the list says.
    _unreachable(seen, "direct_loopback", "direct_host_ip", "postgres_tcp", "redis_tcp", "postgres_unix", "udp_out", "dns")

    blocked = {(e["data"]["host"], e["data"]["port"]) for e in sandboxed.events(view["id"]) if e["kind"] == "blocked_connection"}
    assert blocked == {("not-listed.example", 80), ("10.1.2.3", 80), ("[::1]", host_server),
                       ("localhost", host_server), ("evil.example", 443)}


def test_a_listed_name_that_resolves_to_loopback_is_refused_and_logged(sandboxed, host_server):
    view, seen = _probe(sandboxed, host_server, ["localhost"])
    assert view["state"] == "done", (view, seen)
    assert seen["loopback_name"].startswith("refused 403") and "loopback" in seen["loopback_name"]
    assert seen["listed"].startswith("refused 403")  # 127.0.0.1 itself is not listed here
    reasons = {e["data"]["host"]: e["data"]["reason"] for e in sandboxed.events(view["id"]) if e["kind"] == "blocked_connection"}
    assert "resolves to a private or loopback address" in reasons["localhost"]
    assert reasons["127.0.0.1"] == "IP addresses must be listed by IP"

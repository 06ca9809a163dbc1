"""Attack: a listed host answers ``302 Location: <an unlisted address>`` (or its name resolves to a
public address for the check and to loopback for the connection). The box's own requests, flow
``http`` steps and the ``http.request`` tool, must not return the unlisted target's body.

Real servers on 127.0.0.1 (the listed host) and 127.0.0.2 (the unlisted one, same loopback).
"""
from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tasks.tools import http as net
from tests.conftest import Box
from tests.http_server import Handler, serving
from tests.sandbox.conftest import needs_sandbox, results

SECRET_BODY = "the internal service's secret page"


@dataclass
class Server:
    port: int
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def _serve(address: str) -> Iterator[Server]:
    seen = Server(0)

    class Redirecting(Handler):
        def _answer(self) -> None:
            seen.paths.append(self.path)
            seen.headers.append({k.lower(): v for k, v in self.headers.items()})
            query = parse_qs(urlsplit(self.path).query)
            if self.path == "/loop":
                query = {"to": ["/loop"]}
            if "to" in query:
                self.reply(int(query.get("status", ["302"])[0]), headers={"Location": query["to"][0]})
                return
            self.reply(200, (SECRET_BODY if address != "127.0.0.1" else f"listed host page {self.path}").encode())

        do_GET = do_POST = _answer

    with serving(Redirecting, address) as port:
        seen.port = port
        yield seen


@pytest.fixture
def listed() -> Iterator[Server]:
    yield from _serve("127.0.0.1")


@pytest.fixture
def unlisted() -> Iterator[Server]:
    yield from _serve("127.0.0.2")


def _redirect(listed: Server, to: str, status: int = 302) -> str:
    return f"http://127.0.0.1:{listed.port}/go?status={status}&to={to}"


def _blocked_events(box: Box, task_id: str) -> list[dict[str, Any]]:
    return [e for e in box.events(task_id) if e["kind"] == "blocked_connection"]


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_an_http_step_redirected_to_an_unlisted_address_is_refused(box: Box, listed: Server, unlisted: Server,
                                                                   status: int) -> None:
    target = f"http://127.0.0.2:{unlisted.port}/admin"
    task = box.create(title="redirect", hosts=["127.0.0.1"],
                      flow={"steps": [{"http": _redirect(listed, target, status), "save": "page"}]})
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed", view
    assert "blocked" in view["error"]
    assert unlisted.paths == [], "the unlisted server was reached"
    assert SECRET_BODY not in str(box.api.get(f"/api/tasks/{task['id']}/report").json())
    blocked = _blocked_events(box, task["id"])
    assert blocked and blocked[0]["data"]["host"] == "127.0.0.2" and blocked[0]["data"]["port"] == unlisted.port


def test_the_http_request_tool_redirected_to_a_loopback_name_is_refused(box: Box, listed: Server, unlisted: Server) -> None:
    target = f"http://localhost:{unlisted.port}/admin"
    task = box.create(title="redirect", hosts=["127.0.0.1"], tools=["http.request"],
                      flow={"steps": [{"tool": "http.request", "args": {"url": _redirect(listed, target)}, "save": "page"}]})
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "failed", view
    assert "blocked" in view["error"]
    assert unlisted.paths == []
    assert _blocked_events(box, task["id"])[0]["data"]["host"] == "localhost"


def test_a_redirect_within_the_listed_hosts_is_followed(box: Box, listed: Server) -> None:
    task = box.create(title="redirect", hosts=["127.0.0.1"], flow={"steps": [
        {"http": {"url": _redirect(listed, "/landing?x=1", 303), "method": "POST", "body": {"a": 1}}, "save": "page"}]})
    view = box.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    assert box.api.get(f"/api/tasks/{task['id']}/report").json()["records"]["page"] == "listed host page /landing?x=1"


def test_credentials_are_not_sent_to_another_listed_host(listed: Server, unlisted: Server) -> None:
    blocked: list[net.Blocked] = []
    result = net.fetch("GET", _redirect(listed, f"http://127.0.0.2:{unlisted.port}/next"), hosts=["127.0.0.1", "127.0.0.2"],
                       headers={"Authorization": "Bearer t0ken", "X-Other": "kept"}, data=None, timeout=5,
                       on_blocked=blocked.append)
    assert result == {"status": 200, "body": SECRET_BODY} and not blocked
    assert listed.headers[0]["authorization"] == "Bearer t0ken"
    assert "authorization" not in unlisted.headers[0] and unlisted.headers[0]["x-other"] == "kept"


def test_too_many_redirects_end_the_request(listed: Server) -> None:
    with pytest.raises(OSError, match="redirects"):
        net.fetch("GET", f"http://127.0.0.1:{listed.port}/loop", hosts=["127.0.0.1"], headers={}, data=None, timeout=5,
                  on_blocked=lambda exc: None)
    assert len(listed.paths) == net.MAX_REDIRECTS + 1


def test_a_name_is_resolved_once_and_connected_to_by_that_address(listed: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: a resolver that answers a public address first and loopback afterwards.
    The name stands for an attacker's domain; the resolver is the attacker's DNS server."""
    real = socket.getaddrinfo
    answers = iter(["198.51.100.7", "127.0.0.1", "127.0.0.1"])
    asked: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.example":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (next(answers), port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(net, "_private", lambda addr: addr.startswith("127."))  # 198.51.100.0/24 counts as public here
    with pytest.raises(OSError):
        net.fetch("GET", f"http://rebind.example:{listed.port}/", hosts=["rebind.example"], headers={}, data=None,
                  timeout=1, on_blocked=lambda exc: None)
    assert asked == ["rebind.example"], "the name was resolved again for the connection"
    assert listed.paths == [], "the connection went to the rebound (loopback) address"


SANDBOX_CLIENT = """
import os, sys, urllib.request, urllib.error
for name in ("NO_PROXY", "no_proxy"):  # the listed host is loopback here; go through the proxy anyway
    os.environ.pop(name, None)
try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:  # follows redirects, through HTTP_PROXY
        print("result=ok %d %s" % (r.status, r.read().decode()))
except urllib.error.HTTPError as e:
    print("result=refused %d %s" % (e.code, e.read().decode().strip()))
except OSError as e:
    print("result=error %s" % e)
"""


@needs_sandbox
def test_a_process_in_the_sandbox_following_a_redirect_is_refused_at_the_unlisted_hop(
        sandboxed: Box, listed: Server, unlisted: Server) -> None:
    target = f"http://127.0.0.2:{unlisted.port}/admin"
    task = sandboxed.create(title="redirect", prompt="p", worker="command", hosts=["127.0.0.1"],
                            command=["/usr/bin/python3", "-c", SANDBOX_CLIENT, _redirect(listed, target)])
    view = sandboxed.wait_state(task["id"], "done", "failed")
    assert view["state"] == "done", view
    seen = results(sandboxed, task["id"])
    assert seen["result"].startswith("refused 403"), seen
    assert unlisted.paths == [] and len(listed.paths) == 1
    blocked = _blocked_events(sandboxed, task["id"])
    assert blocked and blocked[0]["data"]["host"] == "127.0.0.2"

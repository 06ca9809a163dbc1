"""HTTP from a task, under its network policy (the listed hosts only).

Inside the sandbox the egress proxy enforces this for every process; this module enforces the
same rule for requests the box makes on a task's behalf (flow ``http`` steps, ``http.request``),
on every redirect hop, connecting only to the addresses the check resolved.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    from tasks.run.context import RunContext

MAX_BODY = 256 * 1024


class Blocked(Exception):
    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"connection to {host}:{port} blocked: {reason}")
        self.host, self.port, self.reason = host, port, reason


def host_allowed(host: str, hosts: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for entry in hosts:
        entry = entry.lower().split(":")[0] if not entry.startswith("[") else entry.lower()
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and host != entry[2:]:
                return True
        elif host == entry.strip("[]"):
            return True
    return False


def host_covered(entry: str, hosts: list[str]) -> bool:
    """Every address the hosts entry ``entry`` lets a task reach, ``hosts`` lets it reach too."""
    if entry in hosts:
        return True
    wildcards = [h for h in hosts if h.startswith("*.") and ":" not in h]
    if entry.startswith("*."):
        return any(entry[1:].endswith(w[1:]) for w in wildcards)
    name = entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry
    return host_allowed(name, wildcards + [h for h in hosts if ":" not in h])


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _private(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified


def allowed_addresses(host: str, port: int, hosts: list[str]) -> list[str]:
    """The addresses a connection to ``host``:``port`` may use under ``hosts``, or ``Blocked``.

    The one allowlist rule, shared by the box's own requests and the sandbox's egress proxy. The
    caller connects only to the returned addresses, so a name cannot resolve to a public address
    for the check and to a private one for the connection.
    """
    bare = host.strip("[]").lower()
    listed_exactly = any(bare == h.strip("[]").lower() for h in hosts)
    if _is_ip(bare) or host.startswith("["):
        if not listed_exactly:
            raise Blocked(host, port, "IP addresses must be listed by IP")
        return [bare]
    if not host_allowed(bare, hosts):
        raise Blocked(host, port, "host not in the task's list")
    try:
        infos = socket.getaddrinfo(bare, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise Blocked(host, port, f"name does not resolve ({exc.strerror})") from exc
    addresses: list[str] = []
    for info in infos:
        addr = str(info[4][0])
        if _private(addr) and not any(addr == h.strip("[]") for h in hosts):
            raise Blocked(host, port, f"{bare} resolves to a private or loopback address ({addr})")
        if addr not in addresses:
            addresses.append(addr)
    return addresses


REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 5
# Sent to the first host only: a redirect elsewhere must not carry the caller's credentials.
_CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})

OnBlocked = Callable[[Blocked], None]


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # as in the URL: a name, an IPv4 address or a [bracketed] IPv6 address
    port: int
    path: str  # path and query, what the request line carries

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host.lower(), self.port


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ValueError(f"bad port in {url}") from exc
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(parts.scheme, host, port, path)


def _connection(target: _Target, addresses: list[str], timeout: float) -> http.client.HTTPConnection:
    """A connection to ``target`` that can reach only ``addresses`` (already checked): the name
    is never resolved again, so DNS cannot answer differently for the connection. TLS still
    verifies the certificate against the name."""

    def connect(_address: tuple[str, int], timeout: float = timeout, source: Any = None) -> socket.socket:
        error: OSError | None = None
        for address in addresses:
            try:
                return socket.create_connection((address, target.port), timeout=timeout)
            except OSError as exc:
                error = exc
        raise error or OSError(f"no address to connect to for {target.host}")

    host = target.host.strip("[]")
    conn: http.client.HTTPConnection
    if target.scheme == "https":
        conn = http.client.HTTPSConnection(host, target.port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, target.port, timeout=timeout)
    conn._create_connection = connect  # type: ignore[attr-defined]  # the stdlib's one hook for this
    return conn


def fetch(method: str, url: str, *, hosts: list[str], headers: dict[str, str], data: bytes | None, timeout: float,
          on_blocked: OnBlocked) -> dict[str, Any]:
    """One HTTP exchange under the allowlist ``hosts``, redirects included.

    Every hop (the first URL and each ``Location``) passes ``allowed_addresses`` and is
    connected to by the addresses that check returned; a refused hop calls ``on_blocked`` and
    raises ``Blocked``. At most ``MAX_REDIRECTS`` are followed; credentials are not sent to
    another origin; 303 (and 301/302 after a POST) continue as a GET without a body.
    """
    method = method.upper()
    target = _target(url)
    first_origin = target.origin
    for hop in range(MAX_REDIRECTS + 1):
        try:
            addresses = allowed_addresses(target.host, target.port, hosts)
        except Blocked as exc:
            on_blocked(exc)
            raise
        sent = headers if target.origin == first_origin else {
            k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
        conn = _connection(target, addresses, timeout)
        try:
            conn.request(method, target.path, body=data, headers=sent)
            response = conn.getresponse()
            location = response.getheader("Location")
            if response.status not in REDIRECTS or not location:
                return {"status": response.status, "body": response.read(MAX_BODY).decode("utf-8", errors="replace")}
        finally:
            conn.close()
        if hop == MAX_REDIRECTS:
            raise OSError(f"more than {MAX_REDIRECTS} redirects")
        current = f"{target.scheme}://{target.host}:{target.port}{target.path}"
        target = _target(urljoin(current, location))
        if response.status == 303 or (response.status in (301, 302) and method == "POST"):
            method, data = ("HEAD" if method == "HEAD" else "GET"), None
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    raise AssertionError("unreachable")


def http_request(ctx: RunContext, method: str, url: str, *, headers: dict[str, str], body: Any = None) -> dict[str, Any]:
    """A flow ``http`` step or an ``http.request`` tool call: ``fetch`` under the task's hosts,
    each refusal recorded as a ``blocked_connection`` event."""
    data: bytes | None
    if body is None:
        data = None
    elif isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **headers}
    else:
        data = str(body).encode()
    timeout = 30.0
    left = ctx.time_left()
    if left is not None:
        timeout = max(0.1, min(timeout, left))

    def record(exc: Blocked) -> None:
        ctx.recorder.event("blocked_connection", f"blocked {exc.host}:{exc.port}: {exc.reason}",
                           {"host": exc.host, "port": exc.port, "reason": exc.reason, "via": "http client"})

    try:
        return fetch(method, url, hosts=ctx.task.hosts, headers=headers, data=data, timeout=timeout, on_blocked=record)
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP response: {exc!r}") from exc

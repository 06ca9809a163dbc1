"""HTTP from a task, under its network policy (the listed hosts only).

Inside the sandbox the egress proxy enforces this for every process; this module enforces the
same rule for requests the box makes on a task's behalf (flow ``http`` steps, ``http.request``).
"""
from __future__ import annotations

import ipaddress
import json
import socket
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from tasks.context import RunContext

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


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def _private(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified


def check_destination(host: str, port: int, hosts: list[str]) -> None:
    """Raise ``Blocked`` unless ``host`` is listed and (for names) resolves to public addresses,
    or is itself a listed IP."""
    allowed_addresses(host, port, hosts)


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


def http_request(ctx: RunContext, method: str, url: str, *, headers: dict[str, str], body: Any = None) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.netloc.rsplit("@", 1)[-1]
    host = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    try:
        check_destination(host, port, ctx.task.hosts)
    except Blocked as exc:
        ctx.recorder.event("blocked_connection", f"blocked {exc.host}:{exc.port}: {exc.reason}",
                           {"host": exc.host, "port": exc.port, "reason": exc.reason})
        raise
    data: bytes | None
    if body is None:
        data = None
    elif isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **headers}
    else:
        data = str(body).encode()
    request = urllib.request.Request(url, data=data, method=method.upper(), headers=headers)
    timeout = 30.0
    left = ctx.time_left()
    if left is not None:
        timeout = max(0.1, min(timeout, left))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            raw = response.read(MAX_BODY)
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(MAX_BODY), exc.code
    text = raw.decode("utf-8", errors="replace")
    return {"status": status, "body": text}

"""The box's egress proxy: the only way out for a task that lists hosts.

An HTTP proxy that runs as threads in the worker process running the task (it has the host's
network; it lives as long as the task's processes do). It accepts plain requests with an
absolute ``http://`` URL and ``CONNECT host:port``, checks the destination with the one allowlist
rule (``tasks.tools.http.allowed_addresses``), connects only to the addresses that check returned, and
then relays bytes. Every refusal answers ``403`` and is recorded as a ``blocked_connection``
event with host and port.

In the sandbox it listens on a Unix socket in the task's runtime directory, reached from inside
the task's network namespace through the forwarder (``tasks/sandbox/init.py``). Without root it
listens on a loopback TCP port and is offered through the proxy environment variables only.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tasks.sandbox.accounts import SandboxError
from tasks.tools.http import Blocked, allowed_addresses

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0
_HOP_BY_HOP = {"proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "trailer", "upgrade"}

OnBlocked = Callable[[str, int, str], None]


@dataclass
class _Request:
    method: str
    host: str
    port: int
    head: bytes  # what to send upstream first (a rewritten request; empty for CONNECT)
    rest: bytes  # bytes the client sent after its head


class BadRequest(Exception):
    pass


def _parse_authority(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise BadRequest(f"bad host {authority!r}")
        host, tail = authority[: end + 1], authority[end + 1:]
        port = int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else default_port
        return host, port
    host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port_text:
        return authority, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadRequest(f"bad port in {authority!r}")
    return host, int(port_text)


def parse_head(head: bytes, rest: bytes) -> _Request:
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise BadRequest("not an HTTP request line")
    method, target, version = parts
    if method.upper() == "CONNECT":
        host, port = _parse_authority(target, 443)
        return _Request("CONNECT", host, port, b"", rest)
    url = urlsplit(target)
    if url.scheme != "http" or not url.netloc:
        raise BadRequest("a proxy request needs an absolute http:// URL (use CONNECT for https)")
    authority = url.netloc.rsplit("@", 1)[-1]
    host, port = _parse_authority(authority, 80)
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    headers = [line for line in lines[1:] if line and line.split(":", 1)[0].strip().lower() not in _HOP_BY_HOP]
    rewritten = "\r\n".join([f"{method} {path} {version}", *headers, "Connection: close", "", ""])
    return _Request(method, host, port, rewritten.encode("latin-1"), rest)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(8192)
        if not chunk:
            raise BadRequest("the client closed before sending a request")
        data += chunk
        if len(data) > MAX_HEAD:
            raise BadRequest("request head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` into ``sink`` until it ends, then end ``sink``'s writing side."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass  # one side closed or reset; the other direction ends on its own
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _answer(sock: socket.socket, status: str, reason: str) -> None:
    body = (reason + "\n").encode()
    try:
        sock.sendall(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\nX-Box-Egress: refused\r\n\r\n".encode() + body)
    except OSError:
        pass


class EgressProxy:
    """One task's egress proxy. ``start`` binds it; ``stop`` closes it (idempotent)."""

    def __init__(self, task_id: str, hosts: list[str], on_blocked: OnBlocked) -> None:
        self.task_id = task_id
        self.hosts = list(hosts)
        self.on_blocked = on_blocked
        self.listener: socket.socket | None = None
        self.socket_path: Path | None = None
        self.port: int | None = None
        self._closed = threading.Event()

    def start_unix(self, path: Path, uid: int, gid: int) -> None:
        if len(os.fsencode(path)) >= 108:
            raise SandboxError(f"the egress socket path is too long for a Unix socket: {path}", field="BOX_DATA_DIR")
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chown(path, uid, gid)
        os.chmod(path, 0o600)
        self.socket_path = path
        self._serve(listener)

    def start_tcp(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self._serve(listener)

    def _serve(self, listener: socket.socket) -> None:
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept_loop, name=f"egress-{self.task_id}", daemon=True).start()

    def stop(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self.listener is not None:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # a listening socket may refuse shutdown; close still wakes accept
            self.listener.close()
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)

    def _accept_loop(self) -> None:
        assert self.listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._handle, args=(client,), name=f"egress-{self.task_id}-conn", daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(HEAD_TIMEOUT_S)
            try:
                request = parse_head(*_read_head(client))
            except (BadRequest, ValueError) as exc:
                _answer(client, "400 Bad Request", str(exc))
                return
            except OSError:
                return
            try:
                addresses = allowed_addresses(request.host, request.port, self.hosts)
            except Blocked as exc:
                self._record_block(exc)
                _answer(client, "403 Forbidden", f"the box refused {exc.host}:{exc.port}: {exc.reason}")
                return
            upstream = self._connect(addresses, request.port)
            if upstream is None:
                _answer(client, "502 Bad Gateway", f"cannot connect to {request.host}:{request.port}")
                return
            client.settimeout(None)
            if request.method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(request.head)
            if request.rest:
                upstream.sendall(request.rest)
            back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
            back.start()
            pipe(client, upstream)
            back.join()
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    def _connect(self, addresses: list[str], port: int) -> socket.socket | None:
        for address in addresses:
            try:
                return socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
            except OSError:
                continue
        return None

    def _record_block(self, exc: Blocked) -> None:
        try:
            self.on_blocked(exc.host, exc.port, exc.reason)
        except Exception:  # noqa: BLE001 - the refusal stands even if its event cannot be written
            log.exception("could not record the blocked connection %s:%s of task %s", exc.host, exc.port, self.task_id)


# The proxies running in this process, by task id, with how many processes use each.
_running: dict[str, tuple[EgressProxy, int]] = {}
_registry_lock = threading.Lock()


def acquire(task_id: str, make: Callable[[], EgressProxy]) -> EgressProxy:
    """The task's running proxy in this process, started by ``make`` if there is none."""
    with _registry_lock:
        if task_id in _running:
            proxy, users = _running[task_id]
            _running[task_id] = (proxy, users + 1)
            return proxy
        proxy = make()
        _running[task_id] = (proxy, 1)
        return proxy


def release(task_id: str, *, all_users: bool = False) -> None:
    """One process of the task ended (or, with ``all_users``, the task did): stop at zero."""
    with _registry_lock:
        if task_id not in _running:
            return
        proxy, users = _running[task_id]
        if users > 1 and not all_users:
            _running[task_id] = (proxy, users - 1)
            return
        del _running[task_id]
    proxy.stop()

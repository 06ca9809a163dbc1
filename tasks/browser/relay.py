"""Reaching a sandboxed Chromium's DevTools port from the worker (docs/internals/decisions-isolation.md#a-tasks-browser, "A task's
browser").

Chromium listens for DevTools on 127.0.0.1 of the task's own network namespace, which nothing
outside the namespace can reach. The worker (root) opens each connection from a short-lived
thread that first joins that namespace (``setns`` on ``/proc/<pid>/ns/net``; a socket keeps the
namespace it was made in), and offers it to Playwright's driver on a loopback port of the host.
That port forwards exactly one path, the browser's own ``/devtools/browser/<id>`` (an unguessable
id Chromium printed to the worker alone): any other request, from any other local program, is
answered 404 and closed.
"""
from __future__ import annotations

import ctypes
import os
import socket
import threading

from tasks.sandbox.egress import pipe

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_HEAD_LIMIT = 16 * 1024


def connect_in_namespace(pid: int, port: int, *, timeout: float = 10.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port`` inside the network namespace of process ``pid``."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def inside() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err))
            finally:
                os.close(fd)
            made.append(socket.create_connection(("127.0.0.1", port), timeout=timeout))
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            failed.append(exc)

    # This thread ends inside the task's namespace and is never reused: no other code runs there.
    thread = threading.Thread(target=inside, name="box-browser-netns", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    conn = made[0]
    conn.settimeout(None)
    return conn


class DevtoolsRelay:
    """A loopback listener on the host that forwards the browser's DevTools WebSocket path into
    the task's namespace. ``url`` is what Playwright connects to."""

    def __init__(self, pid: int, port: int, path: str) -> None:
        self.pid = pid
        self.port = port
        self.path = path
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self._stopped = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_loop, name="box-browser-relay", daemon=True).start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self._listener.getsockname()[1]}{self.path}"

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        client.settimeout(10)
        try:
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                chunk = client.recv(4096)
                if not chunk:
                    break
                head += chunk
            first = head.split(b"\r\n", 1)[0].split(b" ")
            if len(first) < 2 or first[0] != b"GET" or first[1] != self.path.encode():
                client.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                client.close()
                return
            upstream = connect_in_namespace(self.pid, self.port)
        except OSError:
            client.close()
            return
        client.settimeout(None)
        # DevTools is many small messages, each answered before the next is sent: Nagle's
        # algorithm would hold one back until the last is acknowledged.
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._conns += [client, upstream]
        upstream.sendall(head)
        back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
        back.start()
        pipe(client, upstream)
        back.join()
        client.close()
        upstream.close()

    def stop(self) -> None:
        self._stopped.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except OSError:
                    pass
            self._conns.clear()

"""The per-task broker socket: a Unix stream socket speaking JSON lines (``protocol``).

Opened by a run when it starts its first process (``serving``; a run that starts none never
opens one), closed when the run ends. Its accept loop waits on the listening socket and a wake-up pipe together, so closing takes
no poll interval: the close writes one byte to the pipe and the loop returns at once. Only the
box's own user and the task's Linux user may connect: each connection's peer credentials are
checked, and the socket lives in the task's private runtime directory. Each connection is served
by one of a few long-lived threads, each with its own database connection; every write goes
through the run's step recorder, so a run that lost its lease writes nothing.
"""
from __future__ import annotations

import logging
import os
import queue
import selectors
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection

from boxsite.core.errors import BoxError
from tasks.broker import paths
from tasks.broker.calls import Calls
from tasks.broker.holds import Holds
from tasks.broker.protocol import MAX_LINE, CallError, TaskEnded, decode, encode, reply_error, reply_ok
from tasks.run.context import RunContext
from tasks.run.recorder import LeaseLost, LimitReached
from tasks.sandbox import accounts, users

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
POOL_SIZE = 4  # connections served at once; more wait their turn (holds are one at a time anyway)


class _SocketServer(socketserver.UnixStreamServer):
    """Connections are served by a few long-lived threads, so each keeps its database connection
    across calls (a fresh PostgreSQL connection per `box` call would cost more than the call)."""

    broker: BrokerServer

    def start_pool(self, size: int) -> None:
        self._queue: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._pool = [threading.Thread(target=self._serve_queue, name=f"broker-{self.broker.ctx.task.pk}-{i}", daemon=True)
                      for i in range(size)]
        for thread in self._pool:
            thread.start()

    def stop_pool(self) -> None:
        for _ in self._pool:
            self._queue.put(None)

    def accept_until_woken(self, wake_fd: int) -> None:
        """Accept connections until ``wake_fd`` becomes readable (``BrokerServer.close``)."""
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(wake_fd, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fd == wake_fd for key, _ in ready):
                    return
                self._accept_one()

    def _accept_one(self) -> None:
        try:
            request, client_address = self.get_request()
        except OSError:
            return  # the client gave up before we accepted it
        request.setblocking(True)
        if self.verify_request(request, client_address):
            self.process_request(request, client_address)
        else:
            self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._queue.put((request, client_address))

    def _serve_queue(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                request, client_address = item
                try:
                    self.finish_request(request, client_address)
                except Exception:  # noqa: BLE001 - one broken connection must not stop the pool
                    log.exception("broker connection for %s failed", self.broker.ctx.task.pk)
                finally:
                    self.shutdown_request(request)
        finally:
            connection.close()  # this thread's database connection, opened by its calls

    def verify_request(self, request: Any, client_address: Any) -> bool:
        raw = request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid, uid, _gid = _PEERCRED.unpack(raw)
        if uid in self.broker.allowed_uids():
            return True
        log.warning("broker for %s refused a connection from uid %s (pid %s)", self.broker.ctx.task.pk, uid, pid)
        return False


class _Handler(socketserver.StreamRequestHandler):
    server: _SocketServer

    def handle(self) -> None:
        broker = self.server.broker
        broker.track(self.request)
        try:
            while not broker.closing.is_set():
                line = self.rfile.readline(MAX_LINE + 1)
                if not line:
                    return
                if len(line) > MAX_LINE:
                    self.wfile.write(encode(reply_error(None, CallError(f"a request is at most {MAX_LINE} bytes"))))
                    return
                reply = broker.serve_line(line)
                self.wfile.write(encode(reply))
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            log.debug("broker client of %s went away: %s", broker.ctx.task.pk, exc)
        finally:
            broker.untrack(self.request)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass  # the client is gone; nothing left to flush to


class BrokerServer:
    """One run's broker. ``limit_reached`` is set when a call ran past a task limit."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.closing = threading.Event()
        self.holds = Holds(ctx, self.closing)
        self.calls = Calls(ctx, self.holds)
        self.path: Path = paths.socket_path(ctx.task.pk)
        self.limit_reached: LimitReached | None = None
        self._server: _SocketServer | None = None
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # (read end, write end) of the accept loop's wake-up pipe
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._server is not None

    def start(self) -> Path:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()  # a socket a crashed run left behind
        # A deep BOX_DATA_DIR can make the path longer than a socket address allows; binding
        # through an open descriptor of the directory creates the same file.
        dir_fd = os.open(self.path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            server = _SocketServer(paths.short_address(self.path, dir_fd), _Handler, bind_and_activate=False)
            server.broker = self
            try:
                server.server_bind()
                self._restrict_to_task_user()
                server.server_activate()
            except OSError:
                server.server_close()
                raise
        finally:
            os.close(dir_fd)
        self._server = server
        server.start_pool(POOL_SIZE)
        self._wake = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=server.accept_until_woken, args=(self._wake[0],),
                                        name=f"broker-{self.ctx.task.pk}", daemon=True)
        self._thread.start()
        return self.path

    def _restrict_to_task_user(self) -> None:
        # The sandbox may create the task's user after the broker starts, so the socket itself is
        # open and the check happens per connection (peer credentials, ``allowed_uids``); the
        # runtime directory (0700, the task user's) keeps other tasks from even reaching it.
        account = self._task_account()
        if account is None:
            os.chmod(self.path, 0o666)
        else:
            os.chown(self.path, account.uid, account.gid)
            os.chmod(self.path, 0o600)

    def _task_account(self) -> accounts.Identity | None:
        """The user the task holds from the box's pool (None: not root, or not claimed yet). It
        cannot change while the task runs: a user goes back to the pool only at release."""
        return users.find_user(self.ctx.task.pk) if os.geteuid() == 0 else None

    def allowed_uids(self) -> set[int]:
        """The box itself, and the task's own Linux user: nobody else may call this broker."""
        account = self._task_account()
        return {os.geteuid()} | ({account.uid} if account is not None else set())

    def close(self) -> None:
        """Stop serving: held calls give up, open connections are cut, the socket file goes."""
        self.closing.set()
        if self._wake is not None and self._thread is not None:
            os.write(self._wake[1], b"x")
            self._thread.join()
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self._server is not None:
            self._server.server_close()
            self._server.stop_pool()
        with self._open_lock:
            for conn in list(self._open):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the client
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def track(self, conn: socket.socket) -> None:
        with self._open_lock:
            self._open.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._open_lock:
            self._open.discard(conn)

    def serve_line(self, line: bytes) -> dict[str, Any]:
        request_id: Any = None
        try:
            message = decode(line)
            request_id = message.get("id")
            return reply_ok(request_id, self.calls.dispatch(message))
        except BoxError as exc:
            return reply_error(request_id, exc)
        except LimitReached as exc:
            self.limit_reached = exc
            return reply_error(request_id, CallError(f"{exc.message}; {exc.hint}", code="LIMIT_REACHED"))
        except LeaseLost:
            return reply_error(request_id, TaskEnded("this run no longer holds the task (cancelled, or taken over)"))
        except Exception as exc:  # noqa: BLE001 - reported to the caller and logged, never silent
            log.exception("broker call for task %s failed", self.ctx.task.pk)
            return reply_error(request_id, CallError(f"the broker failed: {type(exc).__name__}: {exc}", code="BROKER_ERROR"))


@contextmanager
def serving(ctx: RunContext) -> Iterator[BrokerServer]:
    """The run's broker for the duration of the ``with`` block. It opens when the run starts its
    first process (``ctx.before_process``, which ``tasks.sandbox.launcher.popen`` calls): a run
    that starts none (a flow of file steps) never binds a socket or starts a thread."""
    broker = BrokerServer(ctx)
    opened = threading.Lock()

    def open_broker() -> None:
        with opened:
            if not broker.started:
                broker.start()

    ctx.before_process = open_broker
    try:
        yield broker
    finally:
        ctx.before_process = None
        with opened:
            if broker.started:
                broker.close()

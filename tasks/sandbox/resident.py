"""A run's resident init: the sandbox's PID 1 (``init.serve``) started at the run's first command
and kept until the run ends, so each further command costs a fork inside the task's namespaces,
not a new interpreter, a new root and new namespaces.

The worker holds the only end of init's control socket (a ``SOCK_SEQPACKET`` pair, never
inherited by anything else). Each command is one request: ``run`` with its configuration (a
memfd: the script and its secrets never travel in a command line), its stdout and stderr pipes,
a reply socket and the receipt's files. Init forks a keeper for it, which gives the command PID,
mount, IPC and UTS namespaces of its own and replies with the pidfd of the command's PID 1 (the
handle the worker kills it by), then with how it ended. Closing the control socket (the run's
end, or the worker's death) makes init wait for its commands' endings and exit, which ends the
task's namespaces.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from tasks.sandbox import support

CLOSE_WAIT_S = 10  # the run's end: init's own exit, its namespaces torn down
# unshare (and so init) gets SIGKILL when the worker thread that started it dies. Without
# --kill-child: init outlives unshare long enough for a command that already exited to write its
# receipt; the control socket's end tells it the worker is gone.
UNSHARE = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount",
           "--ipc", "--uts", "--propagation", "private", "--"]


class Command:
    """A command started by the resident init, as much of ``subprocess.Popen`` as the box uses:
    ``stdout``, ``stderr``, ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``."""

    def __init__(self, args: list[str], stdout: IO[bytes], stderr: IO[bytes], reply: socket.socket | None,
                 pidfd: int, returncode: int | None = None) -> None:
        self.args = args
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.stdin = None
        self._reply = reply
        self._pidfd = pidfd
        self.returncode = returncode
        self.pid = _pid_of(pidfd) if pidfd >= 0 else -1

    def poll(self) -> int | None:
        if self.returncode is None and self._reply is not None:
            ready, _, _ = select.select([self._reply], [], [], 0)
            if ready:
                self._collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._reply is not None:
            ready, _, _ = select.select([self._reply], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._collect()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the command's PID 1: its namespace, and everything in it, goes."""
        if self._pidfd >= 0:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # already gone

    def _collect(self) -> None:
        """The keeper's last word: the exit code (negative: the signal), then its end. A keeper
        that said nothing was killed with the task's namespaces: the command was, too."""
        assert self._reply is not None
        said = b""
        while chunk := self._reply.recv(64):
            said += chunk
        try:
            self.returncode = int(said)
        except ValueError:
            self.returncode = -signal.SIGKILL
        self._reply.close()
        self._reply = None
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def failed(args: list[str], message: str, code: int = 126) -> Command:
    """A command that could not start, as the step sees it: ``code`` and ``message`` on stderr,
    as an init of its own said it."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    os.close(out_write)
    os.write(err_write, message.encode()[:60000])
    os.close(err_write)
    return Command(args, open(out_read, "rb"), open(err_read, "rb"), None, -1, returncode=code)


class ResidentInit:
    """One run's init (``init.serve``), started by ``start`` with the run's namespaces' config."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.proc = proc
        self.control = control
        self.lock = threading.Lock()  # one request at a time on the control socket

    @classmethod
    def start(cls, config: dict[str, Any], passed: tuple[int, ...]) -> ResidentInit:
        """Start init with ``config`` (``view_fd`` and the other descriptors in ``passed``); its
        control socket is added here."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config_read, config_write = os.pipe()
        try:
            config = {**config, "serve": theirs.fileno()}
            command = [*UNSHARE, str(support.SYSTEM_PYTHON), "-I", "-S", str(support.INIT), str(config_read)]
            proc = subprocess.Popen(command, cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                    pass_fds=(*passed, config_read, theirs.fileno()), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            os.close(config_read)
            config_read = -1
            with open(config_write, "wb") as pipe:
                config_write = -1
                try:
                    pipe.write(json.dumps(config).encode())
                except BrokenPipeError:
                    pass  # init died before reading; the first request says why
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            for fd in (config_read, config_write):
                if fd >= 0:
                    os.close(fd)
        return cls(proc, ours)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, args: list[str], config: dict[str, Any], kept: list[int]) -> Command:
        """Start one command (``config``: its user, argv, script, env, cwd, receipt); ``kept``:
        the receipt's files, passed to its init alone."""
        memfd = os.memfd_create("box-command", os.MFD_CLOEXEC)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            os.write(memfd, json.dumps(config).encode())
            os.lseek(memfd, 0, os.SEEK_SET)
            with self.lock:
                try:
                    socket.send_fds(self.control, [b"run"], [memfd, out_write, err_write, theirs.fileno(), *kept])
                except OSError:
                    for end in (ours, theirs):
                        end.close()
                    for fd in (out_read, err_read):
                        os.close(fd)
                    return failed(args, f"box sandbox: the run's init is gone{self._last_words()}\n")
            theirs.close()
            for fd in (memfd, out_write, err_write):
                os.close(fd)
            memfd = out_write = err_write = -1
            message, fds, _flags, _address = socket.recv_fds(ours, 64, 1)
            if message != b"pid" or not fds:  # no command: its keeper's reason on stderr, or init's own
                for fd in fds:
                    os.close(fd)
                ours.close()
                os.close(out_read)
                with open(err_read, "rb") as errors:
                    said = errors.read().decode(errors="replace")
                if not message:
                    said += f"box sandbox: the run's init is gone{self._last_words()}\n"
                return failed(args, said, int(message) if message.lstrip(b"-").isdigit() else 126)
            return Command(args, open(out_read, "rb"), open(err_read, "rb"), ours, fds[0])
        finally:
            for fd in (memfd, out_write, err_write):
                if fd >= 0:
                    os.close(fd)

    def close(self) -> None:
        """The run is over: let init go (it waits for its commands' endings), and wait for it."""
        self.control.close()
        try:
            self.proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # init is in unshare's group: its namespaces go with it
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def _last_words(self) -> str:
        """What init said before it died (it reports a failed start on stderr), if it is gone."""
        try:
            self.proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            return ""
        if self.proc.stderr is None:
            return ""
        said = self.proc.stderr.read().decode(errors="replace").strip()
        return f": {said}" if said else ""


class Slot:
    """Where a run keeps its resident init (``RunContext.resident``); empty until its first command."""

    def __init__(self) -> None:
        self.init: ResidentInit | None = None
        self.ident: Any = None  # the task's user the init was started for (``accounts.Identity``)
        self.on_close: list[Any] = []


@contextmanager
def serving(ctx: Any) -> Iterator[Slot]:
    """A resident init for the commands the run starts inside the block, stopped at its end."""
    slot = Slot()
    ctx.resident = slot
    try:
        yield slot
    finally:
        ctx.resident = None
        if slot.init is not None:
            slot.init.close()
            slot.init = None
            slot.ident = None
        for then in slot.on_close:
            then()


def _pid_of(pidfd: int) -> int:
    """The process's pid in this (the worker's) PID namespace, as its pidfd's fdinfo says."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as info:
            for line in info:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1

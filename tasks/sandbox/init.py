"""The first process inside a task's namespaces (PID 1 of its PID namespace).

Started as root by ``unshare`` (new PID, network, mount, IPC and UTS namespaces), it:

1. brings up loopback (the network namespace has nothing else: no route out);
2. builds the task's root and pivots into it: a read-only system image (/usr and the links to
   it, a minimal /etc with its own passwd and group, a few devices), the task's view (a
   detached, id-mapped mount passed as an fd) and runtime directory (its sockets) at their host
   paths, private /tmp, /var/tmp, /dev/shm and /run, its own /proc and /sys. The host's other
   directories and its mount table are gone from the namespace;
3. drops to the task's user for good: no supplementary groups, no_new_privs (setuid binaries
   and file capabilities give nothing), a cap on processes; joins a fresh session keyring and
   empties the user's keyrings (a recycled uid finds nothing of an earlier task);
4. installs the seccomp filter (``syscall_filter``, the box's own ctypes binding of libseccomp):
   no new user namespaces, no mounts, no ptrace, no bpf, no keyctl on the user's shared keyrings;
5. with hosts, serves the in-namespace HTTP(S) proxy on 127.0.0.1, relaying every connection
   over a Unix socket to the box's egress proxy, which decides;
6. starts the task's command in a new session (no controlling terminal) and reaps orphans until
   it exits, then exits with its status, which kills everything left in the namespace;
7. exits the same way the moment the box's worker is gone (the worker reads our output; when it
   dies, its end of that pipe closes), so a lost worker's step never runs on unsupervised. A
   parent-death signal cannot do this here: dropping privileges clears it;
8. with ``keep`` (a step's receipt, ``tasks.run.receipts``), relays the command's output to the
   worker and into the receipt's spool files, and when the command ends by itself writes how it
   ended to the receipt, before exiting: the receipt does not depend on the worker living past
   the command's exit. The files were opened by the box (root's, in its spool directory) and
   reach us as descriptors the command never inherits.

Runs under the system ``/usr/bin/python3 -I -S`` with only the standard library and two modules
beside it, loaded by path: the task's root (``task_root.py``) and the filter's binding
(``syscall_filter.py``). It must not import the box (the task's
user cannot read the box's virtualenv, and it starts fast).
"""
from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any


def _sibling(name: str, module: str) -> ModuleType:
    """A module beside this file (``<name>.py``), loaded by path: the isolated interpreter has no
    package to import it from. Called as root before the host's tree is gone (the file is the
    box's); what it defines is used after too. Missing, the start stops."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(module, path)
    if spec is None or spec.loader is None or not os.path.isfile(path):
        sys.stderr.write(f"box sandbox: {path} is missing\n")
        sys.stderr.flush()
        os._exit(126)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


_root = _sibling("task_root", "box_task_root")  # the task's root and a command's scratch directories
_libc = ctypes.CDLL(None, use_errno=True)
_fail, _check, _mount = _root.fail, _root.check, _root.mount

_PR_SET_NO_NEW_PRIVS = 38
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_SYS_KEYCTL, _KEYCTL_GET_KEYRING_ID, _KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_CLEAR = 250, 0, 1, 7
_KEYCTL_LINK, _KEYCTL_UNLINK, _KEYCTL_READ, _KEYCTL_INVALIDATE = 8, 9, 11, 21
_KEY_SPEC_SESSION_KEYRING, _KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING = -3, -4, -5


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def drop_privileges(uid: int, gid: int, nproc: int) -> None:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if os.getuid() != uid or os.geteuid() != uid or os.getgroups():
        _fail("could not drop privileges")


def _keyctl(*args: int | None) -> int:
    return int(_libc.syscall(_SYS_KEYCTL, *args))


def fresh_keyrings() -> None:
    """Join a session keyring of the task's own and empty the uid's user keyrings.

    Run as the task's user. The kernel keeps a uid's user keyrings after its processes are gone,
    so a recycled uid would otherwise find what an earlier task left there; the inherited session
    keyring is the box's own. Each key found is invalidated (gone at once, even from /proc/keys),
    not only unlinked (which leaves it listed until the kernel's collector runs).
    """
    _check(_keyctl(_KEYCTL_JOIN_SESSION_KEYRING, None), "join a new session keyring")
    user_keyring = _keyctl(_KEYCTL_GET_KEYRING_ID, _KEY_SPEC_USER_KEYRING, 1)
    invalidated: set[str] = set()
    for keyring in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING):
        # Linked into our session keyring, the keys in it are ours to invalidate.
        _check(_keyctl(_KEYCTL_LINK, keyring, _KEY_SPEC_SESSION_KEYRING), "reach the user's keyrings")
        buffer = ctypes.create_string_buffer(4096)
        size = _keyctl(_KEYCTL_READ, keyring, ctypes.addressof(buffer), len(buffer))
        _check(size, "list the user's keyrings")
        for (serial,) in struct.iter_unpack("i", buffer.raw[:min(size, len(buffer))]):
            if serial != user_keyring and _keyctl(_KEYCTL_INVALIDATE, serial) == 0:
                invalidated.add(f"{serial:08x}")
        _check(_keyctl(_KEYCTL_CLEAR, keyring), "clear the user's keyrings")
        _keyctl(_KEYCTL_UNLINK, keyring, _KEY_SPEC_SESSION_KEYRING)
    # An invalidated key stays listed in /proc/keys (flag "i") until the kernel's collector runs,
    # within milliseconds: wait for that (bounded), so not even its description shows.
    deadline = time.monotonic() + 2
    while invalidated and time.monotonic() < deadline:
        with open("/proc/keys") as listing:
            invalidated &= {line.split(" ", 1)[0] for line in listing}
        if invalidated:
            time.sleep(0.002)


def empty_keyrings_of(uid: int, gid: int) -> None:
    """At release (as root): become ``uid`` in a throwaway process and empty its keyrings."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    fresh_keyrings()


def load_syscall_filter() -> Callable[[], None]:
    """The filter's binding of libseccomp (``syscall_filter.py``, beside this file), loaded as root
    before the host's tree is gone; returns what installs the filter. Either failing stops the
    start: a task never runs without it."""
    module = _sibling("syscall_filter", "box_syscall_filter")
    try:
        # Built here once: a run's init forks every command of the run from this process, and each
        # loads the program as it is instead of building it again.
        program = module.compiled(module.load())
    except module.FilterError as exc:
        _fail(f"the system-call filter cannot be had: {exc}")

    def install() -> None:
        try:
            module.install_compiled(program)
        except module.FilterError as exc:
            _fail(f"the system-call filter cannot be installed: {exc}")

    return install


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            chunk = source.recv(65536)
            if not chunk:
                break
            sink.sendall(chunk)
    except OSError:
        pass  # either side went away; the other copy loop notices too
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _relay(client: socket.socket, egress_path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(egress_path)
    except OSError:
        client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve_forwarder(listener: socket.socket, egress_path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_relay, args=(client, egress_path), daemon=True).start()


def join_groups(procs_files: list[str]) -> None:
    """Move init into the task's control groups before it starts anything: every process of the
    task then counts against its memory and CPU limits."""
    for path in procs_files:
        try:
            with open(path, "w") as handle:
                handle.write("0")  # 0: the writing process
        except OSError as exc:
            _fail(f"join the task's control group {path}: {exc.strerror}")


def read_config(fd: int) -> dict[str, Any]:
    """The launcher's configuration, from the pipe it passed (never from argv: world-readable)."""
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    config: dict[str, Any] = json.loads(b"".join(chunks))
    return config


def script_argument(script: str) -> str:
    """Put ``script`` in a memfd the command inherits and return the path it opens it by."""
    fd = os.memfd_create("box-script", 0)  # without MFD_CLOEXEC: the command reads it
    os.write(fd, script.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return f"/proc/self/fd/{fd}"


def start_command(config: dict[str, Any], outputs: tuple[int, int] | None = None) -> int:
    """Fork and exec the task's command; an exec failure exits 127 with the reason on stderr.
    With ``outputs``, the command's stdout and stderr are those descriptors."""
    argv = list(config["argv"])
    if config.get("script") is not None:
        argv.append(script_argument(config["script"]))
    pid = os.fork()
    if pid == 0:
        try:
            if outputs is not None:
                os.dup2(outputs[0], 1)
                os.dup2(outputs[1], 2)
            os.setsid()
            os.chdir(config["cwd"])
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.stderr.write(f"{argv[0]}: {exc.strerror}\n")
            sys.stderr.flush()
        os._exit(127)
    return pid


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Relays(threading.Thread):
    """One thread for a command with a receipt: copies its stdout and stderr to the worker (fds 1
    and 2) and into the spool files (at most ``limit`` + 1 bytes each, as the worker's own spooling
    keeps), and watches the worker (``die_with_worker``'s watch, on fd 1). A worker that is gone
    stops only the copy to it, sets ``worker_gone`` and kills the namespace's other processes: the
    spool still gets everything, for the receipt. A spool that cannot be written (a full disk) is
    ``broken``: the copy to the worker goes on, and the receipt gets no ending (the step runs
    again, as one cut off does). ``drained`` is set once both streams ended; the watch goes on."""

    def __init__(self, sources: tuple[int, int], spools: list[int], limit: int) -> None:
        super().__init__(daemon=True)
        self.streams = {source: (sink, spool) for source, sink, spool in zip(sources, (1, 2), spools)}
        self.limit = limit
        self.spooled = dict.fromkeys(sources, 0)
        self.order = sources
        self.broken = False
        self.drained = threading.Event()
        self.worker_gone = threading.Event()

    def run(self) -> None:
        poller = select.poll()
        for source in self.streams:
            poller.register(source, select.POLLIN)
        watch = stat.S_ISFIFO(os.fstat(1).st_mode)
        if watch:
            poller.register(1, 0)  # only the always-reported conditions: POLLERR once no reader is left
        to_sink = {1: True, 2: True}
        while self.streams or watch:
            for fd, events in poller.poll():
                if fd == 1:
                    if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                        poller.unregister(1)
                        watch = False
                        self.worker_gone.set()
                        try:
                            os.kill(-1, signal.SIGKILL)  # every process of the namespace but this one
                        except (ProcessLookupError, PermissionError):
                            pass  # none left
                    continue
                sink, spool = self.streams[fd]
                chunk = os.read(fd, 65536)
                if not chunk:
                    poller.unregister(fd)
                    os.close(fd)
                    del self.streams[fd]
                    if not self.streams:
                        self.drained.set()
                    continue
                room = self.limit + 1 - self.spooled[fd]
                if room > 0 and not self.broken:
                    try:
                        _write_all(spool, chunk[:room])
                        self.spooled[fd] += min(room, len(chunk))
                    except OSError:
                        self.broken = True
                if to_sink[sink]:
                    try:
                        _write_all(sink, chunk)
                    except OSError:
                        to_sink[sink] = False

    def sizes(self) -> list[int]:
        """Bytes spooled from stdout, then stderr."""
        return [self.spooled[source] for source in self.order]


def relays_for(keep: dict[str, Any]) -> tuple[tuple[int, int], Relays]:
    """Pipes for the command's stdout and stderr: the write ends, for the command, and the relay
    of the read ends (started once the command is: no thread runs while we fork)."""
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    return (out_write, err_write), Relays((out_read, err_read), list(keep["spool"]), int(keep["limit"]))


def keep_ending(keep: dict[str, Any], status: int, relays: Relays) -> None:
    """The command ended: stop what it left running (its output then ends), let the relay
    finish, and write how it ended to the receipt, unless it was killed because the worker is
    gone (a step cut off mid-way, which runs again)."""
    cut = relays.worker_gone.is_set() and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    try:
        os.kill(-1, signal.SIGKILL)  # every process of the namespace but this one
    except (ProcessLookupError, PermissionError):
        pass  # none left
    drained = relays.drained.wait(timeout=10)
    if keep.get("hold"):  # a test's: the worker dies here, after the exit, before the receipt is written
        relays.worker_gone.wait(timeout=120)
    if cut or relays.broken or not drained:
        return
    code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    # The ending is written before anything is flushed, so one journal commit takes the three
    # files together rather than one for the spool and another for the ending. An ending kept
    # without its spool is no receipt (``receipts.find`` checks each spool file's size).
    ending = {"code": code, "bytes": relays.sizes()}
    _write_all(keep["ending"], (json.dumps(ending) + "\n").encode())
    if keep.get("flush", True):
        for fd in (*keep["spool"], keep["ending"]):
            os.fsync(fd)


def die_with_worker(fd: int = 1) -> None:
    """Exit (ending the PID namespace) once nobody reads ``fd``: the worker that started us died.
    (A command with a receipt is watched by its ``Relays`` instead, which lets the main loop reap
    the command and decide what its receipt says.)"""
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return
    poller = select.poll()
    poller.register(fd, 0)  # only the always-reported conditions: POLLERR once no reader is left
    while True:
        for _fd, events in poller.poll():
            if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                os._exit(137)


def main() -> None:
    config = read_config(int(sys.argv[1]))
    keep = config.get("keep")
    if keep is not None:  # the receipt's files: never the command's
        for fd in (keep["ending"], *keep["spool"]):
            os.set_inheritable(fd, False)
    join_groups(config.get("cgroups") or [])
    install_syscall_filter = load_syscall_filter()  # before the pivot: the binding's file is the box's
    loopback_up()
    _root.build_root(config)
    if config.get("serve") is not None:
        serve(config, install_syscall_filter)
    run_command(config, install_syscall_filter)


def run_command(config: dict[str, Any], install_syscall_filter: Callable[[], None]) -> None:
    """Become the task's user, start its command and reap until it exits; then exit with its
    status (as PID 1 of its namespace: everything left in it dies with us). Never returns."""
    keep = config.get("keep")
    drop_privileges(config["uid"], config["gid"], config["nproc"])
    fresh_keyrings()
    install_syscall_filter()
    listener = None
    forward = config.get("forward")
    if forward:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", forward["port"]))
        listener.listen(64)
    relays = None
    outputs = None
    if keep is not None:
        outputs, relays = relays_for(keep)
    child = start_command(config, outputs)
    for fd in outputs or ():
        os.close(fd)
    if relays is not None:
        relays.start()  # the worker's watch too
    else:
        threading.Thread(target=die_with_worker, daemon=True).start()
    if listener is not None:
        threading.Thread(target=serve_forwarder, args=(listener, config["forward"]["socket"]), daemon=True).start()
    while True:  # PID 1 adopts every orphan: reap them all, leave when the command exits
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == child:
            if keep is not None and relays is not None:
                keep_ending(keep, status, relays)
            os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


# --- a run's long-lived init ---------------------------------------------------------------------
#
# With ``serve`` (a run's first command, ``launcher.TaskInit``) init stays, as root, PID 1 of the
# task's namespaces for the whole run, and starts each of the run's commands on a request over its
# control socket, which only the worker holds. Each command gets a PID, mount, IPC and UTS
# namespace of its own inside the task's (``_command``): it sees only its own processes and its own
# fresh /proc, /tmp, /var/tmp, /dev/shm and /run, exactly as a command with an init of its own did,
# and everything it started dies with it. The network namespace (loopback and the forwarder) is the
# run's. The root, the view and the control groups are built and joined once.

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID = 0x20000, 0x4000000, 0x8000000, 0x20000000
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
_PR_SET_PDEATHSIG = 1
_COMMAND_FDS = ("config", "stdout", "stderr", "reply")  # what each request passes, in this order


def serve(config: dict[str, Any], install_syscall_filter: Callable[[], None]) -> None:
    """Start the run's commands until the worker closes the control socket (the run ended, or
    the worker died), then wait for the commands still ending (each writes its own receipt) and
    exit. Never returns."""
    control = socket.socket(fileno=int(config["serve"]))
    # A worker's death must not take the namespace with it at once: a command that exited just
    # before must still write its receipt (``keep_ending``). The control socket says it is gone.
    _libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    forwarder = _start_forwarder(config, install_syscall_filter) if config.get("forward") else None
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    while True:
        for fd, _events in poller.poll():
            if fd == wake_read:
                _drain(wake_read)
                _reap()
                continue
            try:
                message, fds, _flags, _address = socket.recv_fds(control, 4096, 16)
            except InterruptedError:
                continue
            except OSError:
                message, fds = b"", []
            if not message:
                for fd_ in fds:
                    os.close(fd_)
                _stop(forwarder)
            _fork_command(message, fds, install_syscall_filter, (control.fileno(), wake_read, wake_write))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stop(forwarder: int | None) -> None:
    """The worker let go: stop the forwarder, let every command finish its ending, exit."""
    if forwarder is not None:
        try:
            os.kill(forwarder, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue


def _start_forwarder(config: dict[str, Any], install_syscall_filter: Callable[[], None]) -> int:
    """The in-namespace proxy, for the whole run: a process of the task's user, under the filter."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", config["forward"]["port"]))
    listener.listen(64)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(int(config["serve"]))
            drop_privileges(config["uid"], config["gid"], config["nproc"])
            fresh_keyrings()
            install_syscall_filter()
            serve_forwarder(listener, config["forward"]["socket"])
        finally:
            os._exit(1)
    listener.close()
    return pid


def _fork_command(message: bytes, fds: list[int], install_syscall_filter: Callable[[], None],
                  ours: tuple[int, ...]) -> None:
    """Start one command (``_command``) for a request, and let go of the request's descriptors."""
    try:
        if message != b"run" or len(fds) < len(_COMMAND_FDS):
            return  # not a request the launcher sends: its reply socket closes unanswered
        pid = os.fork()
        if pid == 0:
            try:
                for fd in ours:
                    os.close(fd)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _command(fds, install_syscall_filter)
            except BaseException as exc:  # noqa: BLE001 - said where the step's stderr shows it
                os.write(fds[2], f"box sandbox: starting the command: {type(exc).__name__}: {exc}\n".encode())
            finally:
                os._exit(126)
    finally:
        for fd in fds:
            os.close(fd)


def _command(fds: list[int], install_syscall_filter: Callable[[], None]) -> None:
    """One command's keeper, in the run's namespaces: make the command's own namespaces, start
    their PID 1 (``_command_init``), hand the worker its pidfd, then how it ended."""
    config_fd, stdout, stderr, reply_fd = fds[:4]
    reply = socket.socket(fileno=reply_fd)
    if _libc.unshare(_CLONE_NEWPID | _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWUTS) != 0:
        os.write(stderr, f"box sandbox: a command's namespaces: {os.strerror(ctypes.get_errno())}\n".encode())
        reply.sendall(b"126")
        os._exit(126)
    pid = os.fork()
    if pid == 0:
        reply.close()
        _command_init(config_fd, stdout, stderr, fds[4:], install_syscall_filter)
    pidfd = os.pidfd_open(pid)
    socket.send_fds(reply, [b"pid"], [pidfd])
    os.close(pidfd)
    kept = fds[4:]  # the receipt's files, flushed here once the worker has its answer
    for fd in fds[:4]:
        if fd != reply_fd:
            os.close(fd)
    while True:
        try:
            _pid, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)  # negative: the signal that killed it, as Popen says
    try:
        reply.sendall(str(code).encode())
    except OSError:
        pass  # the worker is gone
    reply.close()
    # The command's init wrote the receipt's ending before it exited, so it is in the page cache
    # before the worker hears (a worker's death cannot lose it); flushing it to the disk is for a
    # host's crash, which the worker need not wait for. Init waits for this keeper before it exits.
    for fd in kept:
        try:
            os.fsync(fd)
        except OSError:
            pass  # a failing disk: the worker has its answer; nothing here can do better
    os._exit(0)


def _command_init(config_fd: int, stdout: int, stderr: int, kept: list[int],
                  install_syscall_filter: Callable[[], None]) -> None:
    """PID 1 of one command's namespaces: its own /proc and fresh temporary directories (nothing
    of an earlier command's), then ``run_command``. Never returns."""
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.close(stdout)
    os.close(stderr)
    config = read_config(config_fd)
    keep = config.get("keep")
    if keep is not None:  # the receipt's files arrive in the request, after the four fixed ones
        keep["ending"], keep["spool"] = kept[0], kept[1:3]
        keep["flush"] = False  # the keeper flushes them (``_command``)
        for fd in kept:
            os.set_inheritable(fd, False)
    os.environ.clear()
    os.environ.update(config["env"])
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    _root.fresh_scratch(config["runtime"])
    run_command(config, install_syscall_filter)


if __name__ == "__main__":
    if sys.argv[1] == "--empty-keyrings":
        empty_keyrings_of(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()

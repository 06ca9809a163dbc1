"""The first process inside a task's namespaces (PID 1 of its PID namespace).

Started as root by ``unshare`` (new PID, network, mount, IPC and UTS namespaces), it:

1. brings up loopback (the network namespace has nothing else: no route out);
2. attaches the task's view (a detached, id-mapped mount passed as an fd) and hides the host's
   shared writable and socket directories (/tmp, /var/tmp, /dev/shm, /run) behind private tmpfs
   mounts, re-exposing only the task's own runtime directory;
3. drops to the task's user for good: no supplementary groups, no_new_privs (setuid binaries
   and file capabilities give nothing), a cap on processes;
4. with hosts, serves the in-namespace HTTP(S) proxy on 127.0.0.1, relaying every connection
   over a Unix socket to the box's egress proxy, which decides;
5. starts the task's command in a new session (no controlling terminal) and reaps orphans until
   it exits, then exits with its status, which kills everything left in the namespace;
6. exits the same way the moment the box's worker is gone (the worker reads our output; when it
   dies, its end of that pipe closes), so a lost worker's step never runs on unsupervised. A
   parent-death signal cannot do this here: dropping privileges clears it.

Runs under the system ``/usr/bin/python3 -I -S`` with only the standard library: it must not
import the box (the task's user cannot read the box's virtualenv, and it starts fast).
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import select
import socket
import stat
import struct
import sys
import threading
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC = 0x1, 0x2, 0x4, 0x8, 0x1000, 0x4000
_SYS_MOVE_MOUNT, _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 429, 0x4, -100
_PR_SET_NO_NEW_PRIVS = 38
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _fail(message: str) -> None:
    sys.stderr.write(f"box sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(126)


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        _fail(f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def arrange_mounts(config: dict[str, Any]) -> None:
    view = config["view"]
    _check(_libc.syscall(_SYS_MOVE_MOUNT, config["view_fd"], b"", _AT_FDCWD, view.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
           f"attach the view at {view}")
    os.close(config["view_fd"])
    runtime = config["runtime"]
    before = os.stat(runtime)
    keep = os.open(runtime, os.O_PATH | os.O_DIRECTORY)  # survives the directory being hidden
    # A fresh sysfs shows this network namespace's interfaces (loopback), not the host's.
    _mount("sysfs", "/sys", "sysfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY)
    for path in config["hide"]:
        if os.path.isdir(path) and not os.path.islink(path):
            mode = "1777" if path != "/run" else "0755"
            _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={mode},size=64m")
    try:
        now = os.stat(runtime)
        hidden = (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino)
    except FileNotFoundError:
        hidden = True
    if hidden:
        # The runtime directory sat under a hidden path (a data dir in /tmp): bind it back at
        # the same path inside the fresh tmpfs, so socket paths read the same in and out.
        os.makedirs(runtime, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{keep}", runtime, None, _MS_BIND | _MS_REC)
    os.close(keep)


def drop_privileges(uid: int, gid: int, nproc: int) -> None:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if os.getuid() != uid or os.geteuid() != uid or os.getgroups():
        _fail("could not drop privileges")


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


def start_command(config: dict[str, Any]) -> int:
    """Fork and exec the task's command; an exec failure exits 127 with the reason on stderr."""
    argv = list(config["argv"])
    if config.get("script") is not None:
        argv.append(script_argument(config["script"]))
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.chdir(config["cwd"])
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.stderr.write(f"{argv[0]}: {exc.strerror}\n")
            sys.stderr.flush()
        os._exit(127)
    return pid


def die_with_worker(fd: int = 1) -> None:
    """Exit (ending the PID namespace) once nobody reads ``fd``: the worker that started us died."""
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
    loopback_up()
    arrange_mounts(config)
    drop_privileges(config["uid"], config["gid"], config["nproc"])
    listener = None
    forward = config.get("forward")
    if forward:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", forward["port"]))
        listener.listen(64)
    child = start_command(config)
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
            os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()

"""A task user's account: made and removed with the machine's shadow tools, and whatever it left
running or in the kernel's keyrings swept before it serves another task.

The tools rewrite /etc/passwd under a machine-wide lock and fail at once, not wait, when another
holds it; every box process (and every box on the machine) takes turns on ``ACCOUNTS_LOCK`` and
retries a busy answer. The pool that hands these accounts to tasks is ``tasks.sandbox.users``.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import hashlib
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from boxsite.core.errors import BoxError
from tasks.sandbox import paths
from tasks.sandbox.support import INIT, SYSTEM_PYTHON

PREFIX = "box-"


MAX_NAME = 32  # useradd's limit on Linux


# Task users get ids from their own range, far from the distribution's system accounts (100-999,
# which a busy box would exhaust) and from people's accounts.
_ID_RANGE = ["-K", "SYS_UID_MIN=200000", "-K", "SYS_UID_MAX=299999", "-K", "SYS_GID_MIN=200000", "-K", "SYS_GID_MAX=299999"]


_lock = threading.Lock()  # useradd/userdel rewrite /etc/passwd; one at a time from this process


# ... and one at a time across every box process on the machine (web, workers, scheduler, and
# other boxes): the shadow tools fail at once, not wait, when another holds /etc/passwd's lock.
ACCOUNTS_LOCK = Path("/run/lock/box-accounts.lock") if Path("/run/lock").is_dir() else Path("/tmp/box-accounts.lock")


_LOCK_BUSY = ("cannot lock", "lock /etc/", "try again later", "cannot remove entry", "cannot add entry", "unable to lock")


@contextlib.contextmanager
def _accounts_lock() -> Iterator[None]:
    with _lock:
        fd = os.open(ACCOUNTS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock


class SandboxError(BoxError):
    """The sandbox could not be set up (a user, a namespace, a mount)."""

    code = "SANDBOX_ERROR"
    status = 500


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gid: int


def digest(local_dir: str | Path | None = None) -> str:
    name = str(local_dir or paths.local_dir())
    return _digest_of(name) if os.path.isabs(name) else _digest_of.__wrapped__(name)


@functools.lru_cache(maxsize=64)
def _digest_of(local_dir: str) -> str:
    """Resolved once per process and directory: every claim, lookup and release names the box's
    pool by it."""
    return hashlib.sha256(str(Path(local_dir).resolve()).encode()).hexdigest()[:16]


def box_marker(local_dir: str | Path | None = None) -> str:
    """The comment every user of this box's pool carries (which local data directory it belongs
    to; by default this box's)."""
    return f"box pool user {digest(local_dir)}"


def legacy_marker() -> str:
    """The comment of a per-task user (``box-<task id>``) the earlier scheme made."""
    return f"box task user {digest()}"


def identity(name: str) -> Identity | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_gecos != box_marker():
        return None  # never treat someone else's account as the box's
    return Identity(entry.pw_name, entry.pw_uid, entry.pw_gid)


_PASSWD = "/etc/passwd"


_accounts_seen: tuple[tuple[int, ...], list[tuple[str, int, int, str]]] | None = None


def box_accounts() -> list[tuple[str, int, int, str]]:
    """(name, uid, gid, comment) of every ``box-`` account. The whole user database is read
    again only when /etc/passwd changed (useradd and userdel replace it), not at every claim,
    release and refill."""
    global _accounts_seen
    try:
        st = os.stat(_PASSWD)
        version: tuple[int, ...] | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        version = None
    seen = _accounts_seen
    if version is not None and seen is not None and seen[0] == version:
        return seen[1]
    found = [(e.pw_name, e.pw_uid, e.pw_gid, e.pw_gecos) for e in pwd.getpwall() if e.pw_name.startswith(PREFIX)]
    if version is not None:
        _accounts_seen = (version, found)
    return found


def name_used(name: str) -> bool:
    return user_exists(name) or group_exists(name)


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def create(name: str) -> Identity:
    argv = ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
            "--user-group", "--comment", box_marker(), *_ID_RANGE, name]
    run_account_tool(argv, ok_codes={0, 9})  # 9: the name exists (a crash between useradd and its claim)
    found = identity(name)
    if found is None:
        what = "an account of that name is not the box's" if name_used(name) else "it does not exist"
        raise SandboxError(f"useradd could not make the pool user {name}: {what}", field="user")
    return found


_ACCOUNT_TOOLS = {b"useradd", b"userdel", b"groupadd", b"groupdel"}


def account_tools_running() -> set[str]:
    """The accounts the account tools running on the machine now act on (named last)."""
    names = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and os.path.basename(argv[0]) in _ACCOUNT_TOOLS:
            names.add(argv[-1].decode(errors="replace"))
    return names


def remove_user(name: str) -> None:
    """Delete a task user and its group (idempotent)."""
    run_account_tool(["userdel", name], ok_codes={0, 6})  # 6: no such user
    # --user-group made a group of the same name; userdel removes it unless something else
    # uses it. Remove it ourselves if it lingers, so group ids do not leak either (a check
    # first: groupdel is one more turn at the machine-wide lock, and rarely needed).
    if group_exists(name):
        run_account_tool(["groupdel", name], ok_codes={0, 6})


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def run_account_tool(argv: list[str], *, ok_codes: set[int]) -> None:
    # Box processes take turns (``_accounts_lock``); the host's own tools may still hold
    # /etc/passwd's lock (or /etc/subgid's: another box on the machine), and the shadow tools
    # then give up at once (exit 10, or another code with a lock message: 1, 18 for subgid).
    # userdel also refuses while a process of the user is still exiting (exit 8).
    # All of these pass: retry for up to a minute.
    deadline = time.monotonic() + 60
    delay = 0.01
    while True:
        with _accounts_lock():
            # In a session of its own: a kill of the box process's group (a stop's last
            # SIGKILL) must not cut the tool half-way (a user without its group, a group left
            # without its user). Killed itself, the box process leaves a claim start-up knows;
            # the tool finishes on its own, in milliseconds.
            done = subprocess.run(argv, capture_output=True, text=True, check=False, start_new_session=True)
        if done.returncode in ok_codes:
            return
        busy = done.returncode in (8, 10) or any(m in done.stderr for m in _LOCK_BUSY)
        if not busy or time.monotonic() > deadline:
            raise SandboxError(f"{argv[0]} {argv[-1]} failed ({done.returncode}): {done.stderr.strip()}", field="user")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def legacy_users() -> Iterator[Identity]:
    """Per-task users (``box-<task id>``) of this box made by the earlier scheme."""
    marker = legacy_marker()
    for entry in pwd.getpwall():
        if entry.pw_name.startswith(PREFIX) and entry.pw_gecos == marker:
            yield Identity(entry.pw_name, entry.pw_uid, entry.pw_gid)


def processes_of(uid: int) -> list[int]:
    """Pids whose real, effective or saved uid is ``uid`` (from /proc, across all namespaces)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"Uid:"):
                        if str(uid).encode() in line.split()[1:4]:
                            pids.append(int(entry.name))
                        break
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited while we looked
    return pids


def running_processes_of(uid: int) -> list[int]:
    """``processes_of(uid)`` less the zombies: a process that has exited is not running, even
    while its parent (often the machine's init, for a sandbox's own init) has not reaped it."""
    return [pid for pid in processes_of(uid) if not _is_zombie(pid)]


def kill_processes(uid: int, *, timeout: float = 10.0, spare_namespace: str | None = None) -> int:
    """SIGKILL every process of ``uid`` until none is left; returns how many were killed. With
    ``spare_namespace`` (``os.readlink`` of a ``/proc/<pid>/ns/pid``), the processes in that PID
    namespace are left alone.

    Repeats because a process may fork between the scan and the kill. Processes inside a PID
    namespace die with its init, which also runs as the task's user.
    """
    if uid == 0:
        raise SandboxError("refusing to kill the processes of root", field="uid")
    killed = 0
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        pids = [pid for pid in running_processes_of(uid) if not _in_namespace(pid, spare_namespace)]
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise SandboxError(f"processes of uid {uid} survive SIGKILL: {pids}", field="uid")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _in_namespace(pid: int, namespace: str | None) -> bool:
    if namespace is None:
        return False
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == namespace
    except OSError:
        return False


def clear_keyrings(ident: Identity) -> None:
    """Empty the uid's user keyrings: the kernel keeps them after its last process is gone, and
    a later task that gets the same uid must not find what this one left."""
    done = subprocess.run([str(SYSTEM_PYTHON), "-I", "-S", str(INIT), "--empty-keyrings", str(ident.uid), str(ident.gid)],
                          capture_output=True, check=False, cwd="/")
    if done.returncode != 0:
        raise SandboxError(f"could not empty the keyrings of {ident.name}: {done.stderr.decode().strip()}", field="user")


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True

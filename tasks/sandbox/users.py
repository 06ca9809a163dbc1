"""One Linux user per task: ``box-<task id>``, created at the task's first start, removed at cleanup.

Users carry a marker in their comment field naming the box that created them (a hash of its data
directory), so reconciling one box never touches the users of another box on the same machine.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from boxsite.errors import BoxError
from tasks.sandbox.support import INIT, SYSTEM_PYTHON

log = logging.getLogger(__name__)

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


def user_name(task_id: str) -> str:
    name = f"{PREFIX}{task_id}"
    if len(name) > MAX_NAME or not task_id.isalnum():
        raise SandboxError(f"cannot make a Linux user for task id {task_id!r}", field="id")
    return name


def box_marker() -> str:
    """The comment every user of this box carries (which data directory it belongs to)."""
    digest = hashlib.sha256(str(Path(settings.BOX_DATA_DIR).resolve()).encode()).hexdigest()[:16]
    return f"box task user {digest}"


def find_user(task_id: str) -> Identity | None:
    try:
        entry = pwd.getpwnam(user_name(task_id))
    except KeyError:
        return None
    return Identity(entry.pw_name, entry.pw_uid, entry.pw_gid)


def ensure_user(task_id: str) -> Identity:
    """The task's user, created if missing (idempotent; safe across processes)."""
    found = find_user(task_id)
    if found is not None:
        return found
    name = user_name(task_id)
    argv = ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
            "--user-group", "--comment", box_marker(), *_ID_RANGE, name]
    _run_account_tool(argv, ok_codes={0, 9})  # 9: the name exists (another process made it first)
    found = find_user(task_id)
    if found is None:
        raise SandboxError(f"useradd reported success but {name} does not exist", field="user")
    return found


def remove_user(name: str) -> None:
    """Delete a task user and its group (idempotent)."""
    _run_account_tool(["userdel", name], ok_codes={0, 6})  # 6: no such user
    # --user-group made a group of the same name; userdel removes it unless something else
    # uses it. Remove it ourselves if it lingers, so group ids do not leak either.
    _run_account_tool(["groupdel", name], ok_codes={0, 6})


def _run_account_tool(argv: list[str], *, ok_codes: set[int]) -> None:
    # Box processes take turns (``_accounts_lock``); the host's own tools may still hold
    # /etc/passwd's lock, and the shadow tools then give up at once (exit 10, or 1 with a lock
    # message). userdel also refuses while a process of the user is still exiting (exit 8).
    # All of these pass: retry for up to a minute.
    deadline = time.monotonic() + 60
    delay = 0.01
    while True:
        with _accounts_lock():
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode in ok_codes:
            return
        busy = done.returncode in (8, 10) or (done.returncode == 1 and any(m in done.stderr for m in _LOCK_BUSY))
        if not busy or time.monotonic() > deadline:
            raise SandboxError(f"{argv[0]} {argv[-1]} failed ({done.returncode}): {done.stderr.strip()}", field="user")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def box_users() -> Iterator[tuple[str, Identity]]:
    """Every (task id, identity) this box created, from the user database."""
    marker = box_marker()
    for entry in pwd.getpwall():
        if entry.pw_name.startswith(PREFIX) and entry.pw_gecos == marker:
            yield entry.pw_name[len(PREFIX):], Identity(entry.pw_name, entry.pw_uid, entry.pw_gid)


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


def kill_processes(uid: int, *, timeout: float = 10.0) -> int:
    """SIGKILL every process of ``uid`` until none is left; returns how many were killed.

    Repeats because a process may fork between the scan and the kill. Processes inside a PID
    namespace die with its init, which also runs as the task's user.
    """
    if uid == 0:
        raise SandboxError("refusing to kill the processes of root", field="uid")
    killed = 0
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        pids = [pid for pid in processes_of(uid) if not _is_zombie(pid)]
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

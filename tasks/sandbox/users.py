"""One Linux user per task at a time, from a pool of users the box creates ahead.

``useradd``/``userdel`` rewrite /etc/passwd under a machine-wide lock (slow, and far slower
under load), so a task does not make its own user: it *claims* a free user of the box's pool at
its first start and gives it back at release, after the release has stopped every process of the
user, emptied its keyrings, removed its control groups and handed back every file it owned
(``tasks.sandbox.cleanup``). A user is claimed by at most one task at a time.

The claims are symlinks in ``BOX_LOCAL_DIR/users/`` (by default ``BOX_DATA_DIR``): ``<user name> -> <task id>``, made and
removed under a lock file there, so every process of the box (web, workers, scheduler) agrees.
``BOX_USER_POOL`` free users are kept ready: refilled in the background after a claim
(``fill_pool``). A user given back stays in the pool; only once the pool has been quiet (no
claim, no give-back) for ``TRIM_IDLE_S`` does a janitor delete the free users beyond twice
``BOX_USER_POOL`` (``trim_pool``). So a steady stream of tasks pays no ``useradd`` or ``userdel``
(the pool settles at the spares plus the tasks running or still releasing at once), and neither
does a burst after the first: deleting the surplus at each give-back would make every burst
create and delete many users (each under the machine-wide lock), as the janitors' releases lag
the starts. When the pool is empty a task makes one more user on its own path.
``BOX_USER_POOL=0`` keeps no pool: each task's user is made at its start and deleted at its
give-back.

Pool users are named ``box-<box digest>-<n>`` and carry a marker in their comment field naming the
box that created them (a hash of its local data directory), so reconciling one box never touches the
users of another box on the same machine. Users of the earlier one-user-per-task scheme
(``box-<task id>``, marker "box task user") are still found and removed by reconcile.
"""
from __future__ import annotations

import contextlib
import fcntl
import grp
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from django.conf import settings

from boxsite.core import procs
from tasks.sandbox import accounts, paths
from tasks.sandbox.accounts import Identity, SandboxError

log = logging.getLogger(__name__)

_FILLING = ".fill-"  # a claim link's target while a pool user is being made: ``.fill-<pid>``


def _check_task_id(task_id: str) -> str:
    if not task_id.isalnum() or len(task_id) > 64:
        raise SandboxError(f"cannot give a Linux user to task id {task_id!r}", field="id")
    return task_id


def pool_dir(local_dir: str | Path | None = None) -> Path:
    """Where the pool's claims live (of the box with ``local_dir``, by default this one)."""
    return Path(local_dir or paths.local_dir()) / "users"


_pool_thread_lock = threading.Lock()


@contextlib.contextmanager
def _pool_lock() -> Iterator[None]:
    """Claims are made and given back one at a time across the box's processes."""
    directory = pool_dir()
    if not os.path.isdir(directory):  # looked at first: a mkdir of one that exists locks its parent
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _pool_thread_lock:
        fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def pool_users(local_dir: str | Path | None = None) -> list[Identity]:
    """Every user of this box's pool (claimed or free), from the user database (of the box with
    ``local_dir``, by default this one)."""
    marker = accounts.box_marker(local_dir)
    return sorted((Identity(name, uid, gid) for name, uid, gid, gecos in accounts.box_accounts()
                   if gecos == marker), key=lambda i: i.name)


def claims(local_dir: str | Path | None = None) -> dict[str, str]:
    """Pool user name -> the task that holds it (or ``.fill-<pid>`` while it is being made), in
    the pool of the box with ``local_dir`` (by default this one)."""
    found = {}
    try:
        entries = list(os.scandir(pool_dir(local_dir)))
    except FileNotFoundError:
        return {}
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            found[entry.name] = os.readlink(entry.path)
        except (FileNotFoundError, OSError):
            continue
    return found


def _claim_path(name: str) -> Path:
    return pool_dir() / name


def _stem(local_dir: str | Path | None = None) -> str:
    """What every pool user's (and its group's) name starts with: the box's digest (of the box
    with ``local_dir``, by default this one)."""
    return f"{accounts.PREFIX}{accounts.digest(local_dir)[:10]}-"


def _new_name(taken: set[str]) -> str:
    """The first pool name neither ``taken`` nor used by any account or group: a group left
    without its user (a ``userdel`` or ``useradd`` killed half-way) would make ``useradd
    --user-group`` of that name fail every time (``orphan_groups`` removes it at start-up)."""
    stem = _stem()
    n = 0
    while f"{stem}{n}" in taken or accounts.name_used(f"{stem}{n}"):
        n += 1
    return f"{stem}{n}"


def orphan_groups(local_dir: str | Path | None = None) -> list[str]:
    """Groups named as the box's pool users that have no user of that name and no claim (nobody
    is making or deleting that user): left by an account tool killed half-way. Of the box with
    ``local_dir``, by default this one."""
    held = claims(local_dir)
    return [name for name in userless_groups(local_dir) if name not in held]


def userless_groups(local_dir: str | Path | None = None) -> list[str]:
    """Every group named as the box's pool users that has no user of that name, claimed or not
    (a stopped box must have none)."""
    stem = _stem(local_dir)
    return sorted(g.gr_name for g in grp.getgrall() if g.gr_name.startswith(stem) and not accounts.user_exists(g.gr_name))


def remove_orphan_groups() -> list[str]:
    """Delete the ``orphan_groups`` (at start-up and stop, as root); returns their names. One that
    cannot be deleted is logged and left: its name is passed over, so it blocks nothing, and a
    start must not fail on it."""
    removed = []
    for name in orphan_groups():
        with _pool_lock():  # a user of that name is made or deleted only while claimed
            if name in claims() or accounts.user_exists(name):
                continue
            try:
                accounts.run_account_tool(["groupdel", name], ok_codes={0, 6})
            except SandboxError:
                log.exception("the group %s left without its pool user could not be removed; left for the next start", name)
                continue
        removed.append(name)
    return removed


# The user name each task's last claim in this process gave it (``claim_user``): a run's start
# claims, and its view's opening asks right after. Trusted only while the claim's link still names
# the task; the account itself is read at each ask, since another process may make a user anew
# under the same name (with another uid).
_claimed: dict[str, str] = {}
_CLAIMED_MAX = 4096


def find_user(task_id: str) -> Identity | None:
    """The user ``task_id`` holds now, or None."""
    known = _claimed.get(task_id)
    if known is not None:
        try:
            if os.readlink(_claim_path(known)) == task_id:
                return accounts.identity(known)
        except OSError:
            pass
        _claimed.pop(task_id, None)
    for name, holder in claims().items():
        if holder == task_id:
            return accounts.identity(name)
    return None


def _remember(task_id: str, ident: Identity) -> Identity:
    if len(_claimed) >= _CLAIMED_MAX:
        _claimed.clear()
    _claimed[task_id] = ident.name
    return ident


def ensure_user(task_id: str) -> Identity:
    """The task's user: the one it holds, else a free user of the pool it claims now (idempotent;
    safe across processes)."""
    return claim_user(task_id)[0]


def claim_user(task_id: str) -> tuple[Identity, bool]:
    """``ensure_user``, and whether the user was claimed just now (a fresh claim holds nothing of
    an earlier task: its release scrubbed it before giving it back)."""
    ident, fresh = _claim_user(task_id)
    return _remember(task_id, ident), fresh


def _claim_user(task_id: str) -> tuple[Identity, bool]:
    _check_task_id(task_id)
    with _pool_lock():
        held = claims()
        mine = next((name for name, holder in held.items() if holder == task_id), None)
        if mine is None:
            free = [ident for ident in pool_users() if ident.name not in held]
            if free:
                os.symlink(task_id, _claim_path(free[0].name))
                _mark_active()
                _refill_wanted.set()
                return free[0], True
            # The pool is empty: reserve a new name and make the user outside the lock. Until
            # the user exists the claim is the maker's (``.fill-<pid>``): one killed inside
            # useradd leaves a claim ``drop_stale_claims`` knows, and the group useradd may have
            # made goes at the next start (``remove_orphan_groups``); the task's next run claims
            # another name. Held by the task, that claim named a user that never came, and the
            # run that came next failed on the group (``useradd --user-group`` of a name in use).
            mine = _new_name(set(held) | {ident.name for ident in pool_users()})
            os.symlink(_this_maker(), _claim_path(mine))
            _mark_active()
            reserved = True
        else:
            reserved = False
    if not reserved:
        found = accounts.identity(mine)
        if found is not None:
            return found, False
    try:
        made = accounts.create(mine)
    except BaseException:
        with _pool_lock():
            _unlink(_claim_path(mine))
        raise
    if reserved:
        _hold(mine, task_id)
    return made, True


def _hold(name: str, holder: str) -> None:
    """Point ``name``'s claim at ``holder`` (a task, or the process that is deleting it)."""
    with _pool_lock():
        _point(name, holder)


def _point(name: str, holder: str) -> None:
    """``_hold``, for a caller that holds the pool lock."""
    _unlink(_claim_path(name))
    os.symlink(holder, _claim_path(name))


def _this_maker() -> str:
    """The claim of this process while it makes or deletes a pool user (``stale_claims``)."""
    return f"{_FILLING}{os.getpid()}"


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def give_back(task_id: str, ident: Identity) -> None:
    """After the release scrubbed ``ident``: the task no longer holds it, and it is free in the
    pool again (the surplus goes once the pool is quiet: ``trim_pool``). Without a pool
    (``BOX_USER_POOL=0``: a user per task) it is deleted."""
    with _pool_lock():
        if claims().get(ident.name) != task_id:
            return
        if settings.BOX_USER_POOL:
            _unlink(_claim_path(ident.name))
            _mark_active()
            return
        # Still claimed while it goes (nobody else can take it meanwhile), by this process: one
        # killed inside userdel leaves a claim ``drop_stale_claims`` knows. Left as the task's,
        # the claim would name a user that is gone, which no release looks at again (and its
        # group would stay for good).
        _point(ident.name, _this_maker())
    try:
        accounts.remove_user(ident.name)
    except BaseException:
        _hold(ident.name, task_id)  # the task's again: its release is tried again
        raise
    with _pool_lock():
        _unlink(_claim_path(ident.name))


TRIM_IDLE_S = 60.0  # a pool this long without a claim or a give-back is trimmed (``trim_pool``)
_ACTIVE = ".active"  # its time is the pool's last claim or give-back


def _mark_active() -> None:
    """Under the pool lock, at a claim or a give-back."""
    path = pool_dir() / _ACTIVE
    try:
        os.utime(path)
    except FileNotFoundError:
        path.touch()


def quiet_for() -> float:
    """Seconds since the pool's last claim or give-back."""
    try:
        return max(0.0, time.time() - (pool_dir() / _ACTIVE).stat().st_mtime)
    except FileNotFoundError:
        return float("inf")


def trim_pool() -> int:
    """When the pool has been quiet for ``TRIM_IDLE_S``: delete the free users beyond twice
    ``BOX_USER_POOL``; how many were deleted. Each goes claimed as being changed (nobody takes it
    meanwhile; a trim killed there leaves a claim ``drop_stale_claims`` knows), and a claim made
    meanwhile stops the trim."""
    deleted = 0

    def surplus(held: dict[str, str], existing: list[Identity]) -> str | None:
        free = [i for i in existing if i.name not in held]
        return free[-1].name if len(free) > 2 * settings.BOX_USER_POOL else None

    while quiet_for() >= TRIM_IDLE_S and _changing_one(surplus, accounts.remove_user):
        deleted += 1
    return deleted


def _changing_one(pick: Callable[[dict[str, str], list[Identity]], str | None], change: Callable[[str], object]) -> bool:
    """Under the pool's lock, ``pick`` a user from the claims and the pool's users (None: there is
    nothing to do) and claim it as being changed by this process, so nobody takes it meanwhile
    (a process killed there leaves a claim ``drop_stale_claims`` knows); ``change`` it outside the
    lock, then drop the claim. False when ``pick`` found nothing."""
    with _pool_lock():
        name = pick(claims(), pool_users())
        if name is None:
            return False
        os.symlink(_this_maker(), _claim_path(name))
    try:
        change(name)
    finally:
        with _pool_lock():
            _unlink(_claim_path(name))
    return True


@contextlib.contextmanager
def task_lock(task_id: str) -> Iterator[None]:
    """One release of ``task_id`` at a time across the box's processes: a second releaser must
    not act on a user the first has already given back (and another task may hold by then)."""
    _check_task_id(task_id)
    directory = pool_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f".release-{task_id}"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue  # the holder before us removed the file: lock the one there now
            try:
                yield
            finally:
                _unlink(path)
            return
        finally:
            os.close(fd)


_refill_wanted = threading.Event()


def refill_wanted() -> bool:
    """True once after a claim in this process took a pool user (the janitor refills)."""
    wanted = _refill_wanted.is_set()
    _refill_wanted.clear()
    return wanted


def fill_pool() -> int:
    """Make free users until ``BOX_USER_POOL`` are ready; returns how many were made. Off every
    task's path (the janitor, the scheduler's start)."""
    made = 0

    def new(held: dict[str, str], existing: list[Identity]) -> str | None:
        if len([i for i in existing if i.name not in held]) >= settings.BOX_USER_POOL:
            return None
        return _new_name(set(held) | {i.name for i in existing})

    while _changing_one(new, accounts.create):
        made += 1
    return made


def empty_pool() -> None:
    """Delete every free user of the pool (when the box stops: it leaves no account behind)."""
    with _pool_lock():
        held = claims()
        free = [i for i in pool_users() if i.name not in held]
        for ident in free:
            os.symlink(_this_maker(), _claim_path(ident.name))  # nobody claims it while it goes
    for ident in free:
        try:
            accounts.remove_user(ident.name)
        finally:
            with _pool_lock():
                _unlink(_claim_path(ident.name))


def stale_claims() -> dict[str, str]:
    """Claims made by a process that is gone (a zombie too) while it was making or deleting a
    pool user, once no account tool it started on that user is still running (waited for, up to
    ``_TOOL_WAIT_S``): until then the user may still be half-way, and one handed out then would
    vanish under its task."""
    stale = {}
    for name, holder in claims().items():
        if holder.startswith(_FILLING):
            pid = holder[len(_FILLING):]
            if not pid.isdigit() or not procs.alive(int(pid)):
                stale[name] = holder
    deadline = time.monotonic() + _TOOL_WAIT_S
    while stale and (busy := accounts.account_tools_running() & set(stale)):
        if time.monotonic() > deadline:
            return {name: holder for name, holder in stale.items() if name not in busy}
        time.sleep(0.01)  # a tool takes milliseconds: wait for it (at start-up and stop only)
    return stale


_TOOL_WAIT_S = 10.0


def drop_stale_claims() -> None:
    for name, holder in stale_claims().items():
        with _pool_lock():
            if claims().get(name) == holder:
                _unlink(_claim_path(name))


def box_users() -> Iterator[tuple[str, Identity]]:
    """Every (task id, identity) a task of this box holds, from the claims."""
    for name, holder in claims().items():
        if holder.startswith("."):
            continue
        ident = accounts.identity(name)
        if ident is not None:
            yield holder, ident


def mark_ran(ident: Identity) -> None:
    """Before any process runs as ``ident`` (the launcher's only way to start one): from now on
    its uid may hold processes and keys, so its release sweeps them (``ran_processes``)."""
    directory = pool_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    _unlink(directory / f".stopped-{ident.name}")
    os.close(os.open(directory / f".ran-{ident.name}", os.O_WRONLY | os.O_CREAT, 0o600))


def mark_stopped(ident: Identity) -> None:
    """After ``accounts.kill_processes`` left no process of ``ident``: none runs as it again before the
    launcher's next ``mark_ran``, so a later stop of the same task (its layer's seal, then its
    release) does not scan /proc again. Its keys are still there for the release to sweep."""
    os.close(os.open(pool_dir() / f".stopped-{ident.name}", os.O_WRONLY | os.O_CREAT, 0o600))


def processes_stopped(ident: Identity) -> bool:
    """``mark_stopped`` since the launcher last started a process as ``ident``."""
    return (pool_dir() / f".stopped-{ident.name}").exists()


def ran_processes(ident: Identity) -> bool:
    """Whether a process may have run as ``ident`` since its last complete sweep. A pool user
    is made by ``useradd`` with no process and no key, and only the launcher starts processes
    as it, after ``mark_ran``: without the mark, the /proc scan and the keyring sweep (a start
    of the system Python) would find nothing, and are skipped."""
    return (pool_dir() / f".ran-{ident.name}").exists()


def swept(ident: Identity) -> None:
    """After ``ident``'s processes were killed and its keyrings emptied: nothing of it is left."""
    _unlink(pool_dir() / f".ran-{ident.name}")
    _unlink(pool_dir() / f".stopped-{ident.name}")



"""Cleanup that always works: after a task ends, and at start-up for what a crash left behind.

``release`` stops every process of the task's user (PID namespaces die with their init, and a
scan of /proc catches anything else running as that uid), closes the task's egress proxy and
sockets, removes its control groups, empties the uid's keyrings, hands back to root every file
the user owned in the task's directories, and only then gives the user back to the pool
(``users.give_back``), so the next task that claims it finds nothing of this one. The process
and keyring sweeps run only for a user a process ran as (``users.ran_processes``): a task of
file steps alone costs neither a /proc scan nor a start of the system Python. A step that
fails leaves the user claimed: nobody gets it, and reconcile tries again. Every step is
idempotent.

``stop`` is the part a task's layer waits for (its processes gone, its files handed back): the
seal runs right after it, and the slower rest (control groups, the keyring sweep, giving the
user back) after the seal, so a dependent opening its view over the layer does not wait for it.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

from django.conf import settings

from tasks.models import Task
from tasks.sandbox import accounts, cgroups, egress, paths, users
from tasks.states import ACTIVE

log = logging.getLogger(__name__)


def stop(task_id: str) -> None:
    """What an ended task's layer needs before it seals and joins a stack: no process of the
    task left, and every file its user owned handed back to root (or a later task's id-mapped
    view would show them as nobody's). The first half of ``release``, and all a dependent waits
    for (``tasks.layers.seal_layer``); the rest of the release comes after the seal."""
    egress.release(task_id, all_users=True)
    if os.geteuid() == 0:
        with users.task_lock(task_id):
            ident = users.find_user(task_id)
            if ident is not None:
                # the mark stays: ``release`` sweeps the keyrings
                if users.ran_processes(ident) and not users.processes_stopped(ident):
                    accounts.kill_processes(ident.uid)
                    users.mark_stopped(ident)
                disown_files(task_id, ident)


def release(task_id: str, *, stopped: bool = False) -> None:
    """Free everything the task's sandbox held. Safe to call any number of times, anywhere.
    ``stopped``: ``stop`` completed for the task (its processes were killed), so the /proc scan
    is not done again."""
    egress.release(task_id, all_users=True)
    if os.geteuid() == 0:
        with users.task_lock(task_id):
            ident = users.find_user(task_id)
            if ident is not None:
                if users.ran_processes(ident):  # a task of file steps only never started one
                    if not stopped and not users.processes_stopped(ident):
                        accounts.kill_processes(ident.uid)
                    accounts.clear_keyrings(ident)
                    users.swept(ident)
                cgroups.remove(task_id)
                disown_files(task_id, ident)
                users.give_back(task_id, ident)
    runtime = paths.runtime_dir(task_id)
    while runtime.exists():
        try:
            shutil.rmtree(runtime)
        except FileNotFoundError:
            continue  # another process is releasing the same task: finish whatever it leaves


def stop_leftovers(task_id: str) -> int:
    """Kill processes a lost run of the task left behind (before a new run starts), except the
    browser an earlier run kept across its pause (it lives in a PID namespace of its own)."""
    ident = users.find_user(task_id)
    if ident is None or os.geteuid() != 0 or not users.ran_processes(ident):
        return 0
    return accounts.kill_processes(ident.uid, spare_namespace=_kept_browser_namespace(task_id))


def _kept_browser_namespace(task_id: str) -> str | None:
    try:
        record = json.loads(paths.kept_browser(task_id).read_text())
        namespace = record.get("pidns")
    except (OSError, ValueError, AttributeError):
        return None
    return namespace if isinstance(namespace, str) else None


def disown_files(task_id: str, ident: accounts.Identity) -> None:
    """Hand every file ``ident`` owns under the task's directories back to root.

    Does not cross into mounts (a still-mounted overlay view is the layers' business; its upper
    directory is walked directly), so it costs what the task changed, not the workspace's size.
    """
    # The runtime directory holds an external agent's private HOME (``paths.private_home``).
    for root in (paths.local_dir() / "tasks" / task_id, Path(settings.BOX_DATA_DIR) / "layers" / task_id,
                 paths.runtime_dir(task_id)):
        if root.is_dir():
            _disown_tree(root, ident)


def _disown_tree(root: Path, ident: accounts.Identity) -> None:
    device = root.stat().st_dev
    for current, dirs, files in os.walk(root):
        kept = []
        for name in dirs:
            path = os.path.join(current, name)
            st = _lstat(path)
            if st is None:
                continue
            if st.st_dev == device:
                kept.append(name)
            _disown(path, st, ident)
        dirs[:] = kept
        for name in files:
            path = os.path.join(current, name)
            st = _lstat(path)
            if st is not None:
                _disown(path, st, ident)
    _disown(str(root), os.lstat(root), ident)


def _lstat(path: str) -> os.stat_result | None:
    """None for an entry gone since its directory was listed: nothing of it is left to hand
    back. The layer's release drops a settled disk image's mount point in the background
    (``tasks.layers.disk``), which raced this walk and failed the sandbox's release."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _disown(path: str, st: os.stat_result, ident: accounts.Identity) -> None:
    if st.st_uid == ident.uid or st.st_gid == ident.gid:
        uid = 0 if st.st_uid == ident.uid else st.st_uid
        gid = 0 if st.st_gid == ident.gid else st.st_gid
        try:
            os.lchown(path, uid, gid)
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
            # a read-only (lower) mount: nothing there can be written, by a recycled uid either


def reconcile() -> list[str]:
    """At start-up: release every user of this box whose task has ended or no longer exists,
    and every runtime directory left by such a task. Returns the task ids it cleaned."""

    if os.geteuid() == 0:
        users.drop_stale_claims()
        users.remove_orphan_groups()  # a group whose user's userdel was killed half-way
        for ident in accounts.legacy_users():  # the earlier scheme's per-task users: box-<task id>
            accounts.kill_processes(ident.uid)
            accounts.clear_keyrings(ident)
            disown_files(ident.name[len(accounts.PREFIX):], ident)
            accounts.remove_user(ident.name)
    candidates = {task_id for task_id, _ in users.box_users()} if os.geteuid() == 0 else set()
    runtime_root = paths.runtime_root()
    if runtime_root.is_dir():
        candidates.update(entry.name for entry in os.scandir(runtime_root) if entry.is_dir())
    active = set(Task.objects.filter(pk__in=candidates, state__in=ACTIVE).values_list("pk", flat=True))
    cleaned = sorted(candidates - active)
    for task_id in cleaned:
        log.info("reconcile: releasing the sandbox of ended or unknown task %s", task_id)
        release(task_id)
    return cleaned

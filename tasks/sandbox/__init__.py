"""The sandbox (docs/internals/sandbox.md): a Linux user, PID, network and mount namespace per task.

Modules, one per noun: ``support`` (can this box sandbox?), ``users`` (box-<id> users and their
processes), ``paths`` (the per-task runtime directory, data-dir permissions), ``idmap`` (the
task's view mounted for its user), ``launcher`` (the one place task processes start and stop),
``init`` (PID 1 inside the namespaces, with the forwarder), ``egress`` (the box's egress proxy),
``cleanup`` (release and start-up reconcile).
"""
from __future__ import annotations

from tasks.sandbox import paths, users
from tasks.sandbox.cleanup import reconcile, release, stop, stop_leftovers
from tasks.sandbox.paths import runtime_dir
from tasks.sandbox.support import available


def prepare(task_id: str) -> None:
    """At a run's start, before its view opens: claim the task's user from the pool (first run),
    or stop any process a lost earlier run left behind (a later run). A no-op without the
    sandbox."""
    if not available():
        return

    ident, fresh = users.claim_user(task_id)
    if not fresh:
        stop_leftovers(task_id)
    paths.harden_data_dir()
    paths.ensure_runtime_dir(task_id, ident.uid, ident.gid)  # before the broker binds its socket in it


__all__ = ["available", "prepare", "reconcile", "release", "runtime_dir", "stop", "stop_leftovers"]

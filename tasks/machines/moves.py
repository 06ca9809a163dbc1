"""A workspace moves to another machine: its layers are copied there, then it is homed there.

A move is asked for by the owner (``POST /api/workspaces/<name>/move``) or by the scheduler when
the workspace's machine has been gone longer than ``BOX_MACHINE_GONE_S`` (``hand_over``). Asking
marks the workspace ``moving_to`` the new machine: from then on its runs are not sent anywhere
(``tasks.run.leases.send``), so its tasks wait. The new machine's worker (the job
``tasks.jobs.move_workspace``, sent on that machine's queue) waits until no run of the workspace
is running (a dead machine's runs are lost once their leases expire), copies the workspace from
the old machine's web process (``export``, a tar stream of its base, its tasks' layers and
artifacts), then homes it there, writes a note in the log of each of its tasks not yet ended,
and sends their queued runs to the new machine. A move that could not finish (the old machine
does not answer, a run still running) is asked again after ``BOX_RESEND_S``.

Flats are not copied: they are a cache, built again from the layers where they are missing.
A base outside the data directory (an absolute ``base_dir``) is the owner's own directory and
must be at the same path on the new machine; it is not copied.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from django_q.tasks import async_task

from boxsite.core.errors import Conflict, Forbidden, InvalidRequest, NotAvailable
from boxsite.core.principal import Principal
from boxsite.core.validation import AnyText, Body
from tasks import services
from tasks.events import record_event
from tasks.layers import paths
from tasks.machines import calls, homes
from tasks.models import EventKind, Layer, Run, RunState, Task, Workspace
from tasks.run import artifacts
from tasks.run import leases as runs
from tasks.states import FINAL, State

log = logging.getLogger(__name__)

MOVE_TIMEOUT_S = 3600.0
TAR_FLAGS = ["--sparse", "--xattrs", "--xattrs-include=*", "--numeric-owner"]


# --- asking for a move ----------------------------------------------------------------------

def start_move(workspace: Workspace, target: str, why: str) -> bool:
    """Mark ``workspace`` moving to ``target`` and send the move to that machine's queue (after
    commit). False when it is already moving, or already there."""
    moved = Workspace.objects.filter(pk=workspace.pk, moving_to="").exclude(machine=target).update(
        moving_to=target, moving_since=timezone.now())
    if not moved:
        return False
    log.warning("workspace %s moves from %s to %s: %s", workspace.name, workspace.machine or "-", target, why)
    transaction.on_commit(lambda: _send_move(workspace.pk, target))
    return True


def _send_move(workspace_id: int, target: str) -> None:
    async_task("tasks.jobs.move_workspace", workspace_id, task_name=f"move-{workspace_id}",
               cluster=homes.queue_of(target))


def hand_over() -> int:
    """The scheduler's phase (several machines only): the workspaces of machines gone longer than
    ``BOX_MACHINE_GONE_S`` move to the live machine holding the fewest; a move whose new machine
    is gone meanwhile is given to another; a move not finished after ``BOX_RESEND_S`` is asked
    again. How many moves it started."""
    gone = homes.gone()
    if gone:
        Workspace.objects.filter(moving_to__in=gone).update(moving_to="", moving_since=None)
    live = homes.alive()
    started = 0
    if gone and live:
        held = dict(Workspace.objects.filter(machine__in=live).values_list("machine").annotate(n=Count("pk")))
        for workspace in Workspace.objects.filter(machine__in=gone, moving_to=""):
            target = min(live, key=lambda name: (held.get(name, 0), name))
            why = f"machine '{workspace.machine}' has been silent for more than {settings.BOX_MACHINE_GONE_S:g}s"
            with transaction.atomic():
                if start_move(workspace, target, why):
                    held[target] = held.get(target, 0) + 1
                    started += 1
    again = timezone.now() - timedelta(seconds=settings.BOX_RESEND_S)
    for workspace_id, target in Workspace.objects.filter(~Q(moving_to=""), moving_since__lt=again).values_list(
            "pk", "moving_to"):
        if Workspace.objects.filter(pk=workspace_id, moving_to=target).update(moving_since=timezone.now()):
            _send_move(workspace_id, target)
    return started


# --- the old machine: what is copied ---------------------------------------------------------

def members(workspace: Workspace) -> list[str]:
    """The paths, relative to the data directory, a move copies: the base (when it is inside
    the data directory), and each of its tasks' layer and artifacts."""
    data = paths.data_dir()
    found: list[Path] = []
    base = workspace.base_path()
    if not Path(workspace.base_dir).is_absolute():
        found.append(base)
    layered = Layer.objects.filter(task__workspace=workspace).values_list("task_id", flat=True)
    for task_id in layered:
        found.append(paths.layer_dir(task_id))
    for task_id in Task.objects.filter(workspace=workspace).values_list("pk", flat=True):
        found.append(artifacts.artifact_dir(task_id))
    return [str(path.relative_to(data)) for path in found if path.exists()]


def export(workspace: Workspace) -> subprocess.Popen[bytes]:
    """A tar of ``members`` on the process's stdout. A task's disk image is copied as the sparse
    file it is, after a sync so that what its mounted filesystem wrote is in it; a mount point's
    contents (the image's filesystem) are not crossed into."""
    os.sync()
    return subprocess.Popen(["tar", "-c", *TAR_FLAGS, "--one-file-system", "-C", str(paths.data_dir()), "--",
                             *members(workspace)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


# --- the new machine: the move's job ----------------------------------------------------------

def receive(workspace_id: int) -> bool:
    """Copy the workspace here from its old machine and home it here; False when it cannot be
    done yet (asked again by the scheduler) or is not this machine's to do."""
    workspace = Workspace.objects.filter(pk=workspace_id).first()
    if workspace is None or workspace.moving_to != homes.here():
        return False
    if Run.objects.filter(task__workspace=workspace, state=RunState.RUNNING).exists():
        log.info("workspace %s waits for its running runs to end before it moves", workspace.name)
        return False
    source = workspace.machine
    if workspace.moving_lost:
        return _start_afresh(workspace, source)
    if source and source != homes.here():
        try:
            _copy_from(source, workspace)
        except (calls.MachineUnreachable, OSError, subprocess.SubprocessError) as exc:
            log.warning("workspace %s could not be copied from %s yet: %s", workspace.name, source, exc)
            return False
    with transaction.atomic():
        if not Workspace.objects.filter(pk=workspace.pk, moving_to=homes.here()).update(
                machine=homes.here(), moving_to="", moving_since=None):
            return False
        summary = f"workspace '{workspace.name}' moved from machine '{source or '-'}' to '{homes.here()}'"
        for task in Task.objects.filter(workspace=workspace, machine="").exclude(state__in=FINAL):
            runs.lock_task(task.pk)
            record_event(task, EventKind.NOTE, summary, {"moved": {"from": source, "to": homes.here()}})
    log.warning("%s", summary)
    now = timezone.now()
    for run_id in Run.objects.filter(task__workspace=workspace, state=RunState.QUEUED,
                                     available_at__lte=now).values_list("pk", flat=True):
        runs.enqueue(run_id)
    return True


def _start_afresh(workspace: Workspace, source: str) -> bool:
    """An abandoned workspace homed here with an empty base: each of its tasks whose work was on
    the lost disk says so. A done task is undone (its changes are gone, and nothing may stack
    them), a task not over fails, to be retried by the owner over what the workspace holds now."""
    base = workspace.base_path()
    if not Path(workspace.base_dir).is_absolute():
        paths.private_dir(base.parent)
        base.mkdir(exist_ok=True)
    lost = f"its work was lost with machine '{source}': the owner gave up workspace '{workspace.name}', " \
           f"which starts afresh on '{homes.here()}'"
    with transaction.atomic():
        if not Workspace.objects.filter(pk=workspace.pk, moving_to=homes.here(), moving_lost=True).update(
                machine=homes.here(), moving_to="", moving_since=None, moving_lost=False):
            return False
        for task in Task.objects.filter(workspace=workspace, machine="").exclude(
                state__in=[State.UNDONE, State.FAILED, State.CANCELLED]):
            if task.state == State.DONE:
                services.transition(task, State.UNDONE, summary=lost, data={"lost": {"machine": source}})
            else:
                services.transition(task, State.FAILED, summary=lost, data={"lost": {"machine": source}},
                                    error=lost, recoverable=True)
    log.warning("workspace %s abandoned on %s, started afresh here", workspace.name, source)
    return True


def _copy_from(source: str, workspace: Workspace) -> None:
    data = paths.data_dir()
    stream = calls.open_stream(source, f"{calls.PREFIX}/workspaces/{workspace.name}/export", MOVE_TIMEOUT_S)
    with stream:
        unpack = subprocess.Popen(["tar", "-x", *TAR_FLAGS, "-p", "-C", str(data)], stdin=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        assert unpack.stdin is not None
        try:
            _pump(stream, unpack.stdin)
        finally:
            unpack.stdin.close()
        assert unpack.stderr is not None
        error = unpack.stderr.read()
        unpack.wait(timeout=MOVE_TIMEOUT_S)
    if unpack.returncode != 0:
        raise subprocess.SubprocessError(f"tar -x failed: {error.decode(errors='replace')[-500:]}")


def _pump(source: Any, sink: IO[bytes]) -> None:
    shutil.copyfileobj(source, sink, 1 << 20)


# --- the owner's move ---------------------------------------------------------------------------

class AbandonBody(Body):
    """``POST /api/workspaces/<name>/abandon``."""

    machine = AnyText(required=False, help_text="the live machine to start the workspace afresh on (default: the one holding the "
                                "fewest workspaces)")


def ask_abandon(principal: Principal, workspace: Workspace, body: Any) -> Workspace:
    """The owner gives up a gone machine's workspace: it starts afresh, empty, on a live machine
    (``_start_afresh``). Refused while its machine is alive: a move copies everything then."""
    target = AbandonBody.parse(body).get("machine")
    if not principal.can_change_settings:
        raise Forbidden("a paired device cannot abandon workspaces", field="machine")
    if not settings.BOX_MACHINE:
        raise NotAvailable("this box runs on one machine (BOX_MACHINE is not set): nothing is on a lost machine",
                           field="machine")
    source = workspace.machine
    if not source or source not in homes.gone():
        raise Conflict(f"workspace '{workspace.name}' is on machine '{source or '-'}', which is not gone: move it "
                       "instead (POST /api/workspaces/<name>/move), which copies its files", field="machine",
                       code="MACHINE_ALIVE")
    live = homes.alive()
    if target is None and live:
        held = dict(Workspace.objects.filter(machine__in=live).values_list("machine").annotate(n=Count("pk")))
        target = min(live, key=lambda name: (held.get(name, 0), name))
    if not isinstance(target, str) or target not in live:
        raise InvalidRequest(f"'machine' must name a machine of the box that is alive ({', '.join(live) or 'none'})",
                             field="machine")
    if any(task.folders for task in Task.objects.filter(workspace=workspace).exclude(state__in=FINAL).only("folders")):
        raise Conflict("a folder task of this workspace is not over: its folders are on the lost machine",
                       field="machine")
    with transaction.atomic():
        if Workspace.objects.filter(pk=workspace.pk, machine=source).update(
                moving_to=target, moving_lost=True, moving_since=timezone.now()):
            log.warning("workspace %s on gone machine %s abandoned by the owner: afresh on %s",
                        workspace.name, source, target)
            transaction.on_commit(lambda: _send_move(workspace.pk, target))
    workspace.refresh_from_db()
    return workspace


class MoveBody(Body):
    """``POST /api/workspaces/<name>/move``."""

    machine = AnyText(help_text="the machine (its BOX_MACHINE) to move the workspace to; it must be alive")


def ask_move(principal: Principal, workspace: Workspace, body: Any) -> Workspace:
    """The owner moves ``workspace`` to another machine: checked, then started (``start_move``)."""
    target = MoveBody.parse(body).get("machine")
    if not principal.can_change_settings:
        raise Forbidden("a paired device cannot move workspaces", field="machine")
    if not settings.BOX_MACHINE:
        raise NotAvailable("this box runs on one machine (BOX_MACHINE is not set): there is nowhere to move to",
                           field="machine")
    if not isinstance(target, str) or target not in homes.alive():
        raise InvalidRequest(f"'machine' must name a machine of the box that is alive ({', '.join(homes.alive())})",
                             field="machine")
    if workspace.moving_to:
        raise Conflict(f"workspace '{workspace.name}' is already moving to '{workspace.moving_to}'", field="machine")
    if workspace.machine == target:
        raise Conflict(f"workspace '{workspace.name}' is on '{target}' already", field="machine")
    if any(task.folders for task in Task.objects.filter(workspace=workspace).exclude(state__in=FINAL).only("folders")):
        raise Conflict("a folder task of this workspace is not over: its folders are on this machine", field="machine")
    with transaction.atomic():
        start_move(workspace, target, "the owner moved it")
    workspace.refresh_from_db()
    return workspace

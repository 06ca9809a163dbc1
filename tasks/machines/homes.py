"""Which machine holds a workspace, and so runs its tasks and serves its files.

A workspace's home is ``Workspace.machine``: the machine whose web process created it, one the
owner named, or (for a workspace made before the box had several machines) the first machine
that sends one of its runs. A folder task's home is the machine that made it (``Task.machine``),
which has the folder. While a workspace moves (``moving_to``), its runs are not sent: the move
sends them to the new home once its layers are there (``tasks.machines.moves``).
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from tasks.models import Machine, Run, Task, Workspace


def here() -> str:
    """This machine's name; '' on a box of one machine."""
    return str(settings.BOX_MACHINE)


def queue_of(machine: str) -> str:
    """The queue a machine's worker cluster takes its runs from (its django-q2 cluster name)."""
    return f"{settings.Q_CLUSTER['name']}.{machine}"


class Home(NamedTuple):
    """Where a run's task runs: the machine, and whether its workspace is moving (then nowhere yet)."""

    machine: str
    moving: bool

    @property
    def is_here(self) -> bool:
        return self.machine == here() and not self.moving


def home_of_run(run_id: int) -> Home | None:
    """The home of run ``run_id``'s task (None: no such run). A workspace with no home yet gets
    this machine."""
    row = Run.objects.filter(pk=run_id).values_list(
        "task__machine", "task__workspace_id", "task__workspace__machine", "task__workspace__moving_to").first()
    if row is None:
        return None
    task_machine, workspace_id, machine, moving_to = row
    if task_machine:
        return Home(task_machine, False)
    if not machine:
        machine = adopt(workspace_id)
    return Home(machine, bool(moving_to))


def adopt(workspace_id: int) -> str:
    """Make this machine the home of a workspace that has none; the home it has after that."""
    Workspace.objects.filter(pk=workspace_id, machine="").update(machine=here())
    return str(Workspace.objects.filter(pk=workspace_id).values_list("machine", flat=True).get())


def holder_of(task: Task) -> str:
    """The machine whose disk holds ``task``'s files (its layer, artifacts, folders): its
    workspace's home, or for a folder task the machine that made it. '' when no machine is named
    yet (nothing of it was run anywhere) or on one machine."""
    if task.machine:
        return task.machine
    return workspace_home(task.workspace)


def workspace_home(workspace: Workspace) -> str:
    """Where ``workspace``'s files are: its home, or while it moves, still the old home."""
    return workspace.machine


def away(machine: str) -> bool:
    """``machine`` is another machine (reads of what it holds are asked of it)."""
    return bool(here()) and bool(machine) and machine != here()


def runs_here_q() -> Q:
    """Runs this machine takes: its folder tasks', and those of the workspaces homed on it and not moving."""
    me = here()
    return Q(task__machine=me) | Q(task__machine="", task__workspace__machine=me, task__workspace__moving_to="")


# --- the machines' own beat --------------------------------------------------------------------

class MachineBeat:
    """The worker cluster leader's word that its machine is alive, with where the machine's web
    process answers, written every ``BOX_BEAT_S`` (``due()`` from the leader's loop). A row, not a
    file: the other machines see no file of this one."""

    def __init__(self) -> None:
        self.last = float("-inf")

    def due(self) -> None:
        now = time.monotonic()
        if now - self.last < settings.BOX_BEAT_S:
            return
        Machine.objects.update_or_create(name=here(), defaults={"url": settings.BOX_MACHINE_URL,
                                                                "beat_at": timezone.now()})
        self.last = now


def url_of(machine: str) -> str | None:
    return Machine.objects.filter(name=machine).values_list("url", flat=True).first()


def alive() -> list[str]:
    """The machines whose clusters beat within ``BOX_MACHINE_GONE_S``, by name."""
    since = timezone.now() - timedelta(seconds=settings.BOX_MACHINE_GONE_S)
    return list(Machine.objects.filter(beat_at__gte=since).order_by("name").values_list("name", flat=True))


def gone() -> list[str]:
    """The machines whose clusters have not beaten for ``BOX_MACHINE_GONE_S``."""
    since = timezone.now() - timedelta(seconds=settings.BOX_MACHINE_GONE_S)
    return list(Machine.objects.filter(beat_at__lt=since).order_by("name").values_list("name", flat=True))

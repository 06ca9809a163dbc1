"""What isolation this box gives a task, said plainly (never pretended).

``/api/health`` shows ``describe_isolation()``; each task's first event after it starts says the
same for that task, and ``Task.isolation`` keeps it in one line.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict

from django.conf import settings

from boxsite.core.shapes import Doc
from tasks.layers import disk
from tasks.layers.base import driver_name
from tasks.models import Task
from tasks.sandbox import cgroups, support
from tasks.sandbox.launcher import MAX_PROCESSES


class MemoryLimitView(TypedDict):
    default_mb: int
    enforced: bool
    how: str


class CpuLimitView(TypedDict):
    default_percent: int
    enforced: bool
    how: str


class DiskLimitView(TypedDict):
    default_mb: Annotated[int | None, Doc("null: no default, only tasks that set limits.disk_mb")]
    enforced: bool
    how: str


class ProcessLimitView(TypedDict):
    max: int
    enforced: bool
    how: str


class IsolationLimits(TypedDict):
    """which resource limits hold, with their defaults; each one that does not says why"""

    memory: MemoryLimitView
    cpu: CpuLimitView
    disk: DiskLimitView
    processes: ProcessLimitView


class IsolationView(TypedDict):
    """what confines a task on this box: its mode, what it lacks to sandbox and the fix, then what
    the mode means for each part (the parts a refused box runs nothing with are left out)"""

    sandbox: bool
    mode: Annotated[Literal["root", "off", "refused"], Doc("root: sandboxed as root; off: BOX_SANDBOX=off; "
                                                           "refused: tasks fail at their start")]
    missing: Annotated[list[str], Doc("what the sandbox lacks")]
    reason: NotRequired[Annotated[str | None, Doc("not sandboxed: why")]]
    fix: NotRequired[Annotated[str, Doc("refused: what makes the box able to sandbox")]]
    syscalls: NotRequired[str]
    keyrings: NotRequired[str]
    user: NotRequired[str]
    namespaces: NotRequired[list[str]]
    session: NotRequired[str]
    files: NotRequired[str]
    network: NotRequired[str]
    layers: Annotated[str, Doc("the layer driver new tasks get: overlay or copy")]
    limits: IsolationLimits
    summary: str


def layer_driver() -> str:
    """The layer driver new tasks get (overlay when root and the kernel allow it, else copy)."""

    return driver_name()


def describe_limits(sandboxed: bool) -> IsolationLimits:
    """Which resource limits hold, with their defaults; each one that does not says why."""
    enforced = cgroups.unavailable() if sandboxed else "tasks are not sandboxed"
    held = f"enforced with {cgroups.describe()}" if enforced is None else f"not enforced: {enforced}"
    return {
        "memory": {"default_mb": settings.BOX_TASK_MEMORY_MB, "enforced": enforced is None, "how": held},
        "cpu": {"default_percent": settings.BOX_TASK_CPU_PERCENT, "enforced": enforced is None, "how": held},
        "disk": _disk(sandboxed),
        "processes": {"max": MAX_PROCESSES, "enforced": sandboxed,
                      "how": "RLIMIT_NPROC of the task's user" if sandboxed else "not enforced: tasks are not sandboxed"},
    }


def _disk(sandboxed: bool) -> DiskLimitView:
    """What a task may write to its layer, and whether the kernel holds it to that."""
    reason = disk.unavailable() if sandboxed else "tasks are not sandboxed"
    default = settings.BOX_TASK_DISK_MB or None
    if reason is not None:
        how = f"not enforced: {reason}; limits.disk_mb is refused"
    elif default is None:
        how = f"enforced with {disk.describe()}, for tasks that set limits.disk_mb (no default: BOX_TASK_DISK_MB=0)"
    else:
        how = f"enforced with {disk.describe()}"
    return {"default_mb": default, "enforced": reason is None, "how": how}


def describe_isolation() -> IsolationView:
    """What confines a task on this box: its mode (``support.standing``: root, off or refused),
    what it lacks to sandbox and the fix, then what the mode means for each part."""
    found = support.standing()
    mode = found.mode
    missing = list(found.missing)
    if found.sandboxed:
        return {
            "sandbox": True,
            "mode": mode,
            "missing": missing,
            "syscalls": "a seccomp filter: no new user namespaces, mounts, ptrace, bpf or keyctl on shared keyrings",
            "keyrings": "a fresh session keyring per task; the uid's user keyrings emptied at start and at release",
            "user": "a Linux user per task (box-<id>), no supplementary groups, no_new_privs",
            "namespaces": ["pid", "network", "mount", "ipc", "uts"],
            "session": "a new session with no controlling terminal",
            "files": "the task's own view; the box's data, other tasks' layers and host sockets are out of reach",
            "network": "loopback only; listed hosts through the box's egress proxy, every refusal logged",
            "layers": layer_driver(),
            "limits": describe_limits(True),
            "summary": "sandboxed: own user, PID, network and mount namespaces; network only to listed hosts",
        }
    if found.mode == "refused":
        return {
            "sandbox": False,
            "mode": mode,
            "missing": missing,
            "reason": found.reason,
            "fix": support.FIX,
            "layers": layer_driver(),
            "limits": describe_limits(False),
            "summary": f"tasks are refused: the box cannot sandbox them ({found.reason}); {support.FIX}",
        }
    return {
        "sandbox": False,
        "mode": mode,
        "missing": missing,
        "reason": found.reason,
        "user": "the box's own user",
        "namespaces": [],
        "session": "a new session per process",
        "files": "a copy of the workspace; nothing stops a process from reading other files the box's user can",
        "network": "listed hosts offered through proxy environment variables only; a program that ignores them is not stopped",
        "layers": layer_driver(),
        "limits": describe_limits(False),
        "summary": f"not sandboxed ({found.reason}): the copy driver and proxy environment variables only",
    }


def isolation_of(task: Task) -> tuple[str, IsolationView]:
    """What confines ``task``: the line its row stores (``Task.isolation``) and the full account."""
    described = describe_isolation()
    if described["sandbox"]:
        line = f"sandboxed as {task.user or 'box-' + task.pk}: own PID, network and mount namespaces"
    else:
        line = f"not sandboxed: {described['reason']}; proxy environment variables only"
    return line[:200], described


def isolation_note(described: IsolationView) -> tuple[str, dict[str, Any]]:
    """The note that logs what confines a task (``isolation_of``), recorded with the move that
    starts it (``services.transition``'s ``notes``), which also stores its line."""
    return f"isolation: {described['summary']}", {"isolation": described}

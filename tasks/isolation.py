"""What isolation this box gives a task, said plainly (never pretended).

``/api/health`` shows ``describe_isolation()``; each task's first event after it starts says the
same for that task, and ``Task.isolation`` keeps it in one line.
"""
from __future__ import annotations

from typing import Any


from tasks.models import EventKind, Task


def layer_driver() -> str:
    """The layer driver new tasks get (overlay when root and the kernel allow it, else copy)."""
    from tasks.layers.base import driver_name

    return driver_name()


def describe_isolation() -> dict[str, Any]:
    from tasks.sandbox.support import missing_reason

    from tasks.sandbox.support import syscall_filter_dir

    reason = missing_reason()
    if reason is None:
        return {
            "sandbox": True,
            "syscalls": ("a seccomp filter: no new user namespaces, mounts, ptrace, bpf or keyctl on shared keyrings"
                         if syscall_filter_dir() else
                         "not filtered: the system Python's seccomp module (Debian's python3-seccomp) is missing"),
            "keyrings": "a fresh session keyring per task; the uid's user keyrings emptied at start and at release",
            "user": "a Linux user per task (box-<id>), no supplementary groups, no_new_privs",
            "namespaces": ["pid", "network", "mount", "ipc", "uts"],
            "session": "a new session with no controlling terminal",
            "files": "the task's own view; the box's data, other tasks' layers and host sockets are out of reach",
            "network": "loopback only; listed hosts through the box's egress proxy, every refusal logged",
            "layers": layer_driver(),
            "summary": "sandboxed: own user, PID, network and mount namespaces; network only to listed hosts",
        }
    return {
        "sandbox": False,
        "reason": reason,
        "user": "the box's own user",
        "namespaces": [],
        "session": "a new session per process",
        "files": "a copy of the workspace; nothing stops a process from reading other files the box's user can",
        "network": "listed hosts offered through proxy environment variables only; a program that ignores them is not stopped",
        "layers": layer_driver(),
        "summary": f"not sandboxed ({reason}): the copy driver and proxy environment variables only",
    }


def record_isolation(task: Task) -> None:
    """Store and log what confines ``task``. Call inside the transaction that started it."""
    from tasks.events import record_event

    described = describe_isolation()
    if described["sandbox"]:
        line = f"sandboxed as {task.user or 'box-' + task.pk}: own PID, network and mount namespaces"
    else:
        line = f"not sandboxed: {described['reason']}; proxy environment variables only"
    task.isolation = line[:200]
    Task.objects.filter(pk=task.pk).update(isolation=task.isolation)
    record_event(task, EventKind.NOTE, f"isolation: {described['summary']}", {"isolation": described})

"""A control group per task: its memory and CPU limits, held by the kernel.

The task's group ``box-<id>`` is made under the box process's own group, in cgroup v2 when its
memory and cpu controllers are delegated there, else in the v1 ``memory`` and ``cpu``
hierarchies (a hybrid host). The sandbox's init joins it before it starts anything, so every
process of the task is counted. Memory has no swap to escape to (``memory.swap.max`` /
``memory.memsw.limit_in_bytes``); when the kernel's OOM killer acts inside the group, the task
fails with ``memory limit of N MB reached`` and nothing outside the group is touched. CPU is a
cap: ``cpu_percent`` of one core (``cpu.max`` / ``cpu.cfs_quota_us``).

Where neither is possible (no cgroup filesystem, controllers not delegated, not root)
``unavailable()`` says why, and ``/api/health`` repeats it.
"""
from __future__ import annotations

import errno
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000  # the CPU cap's accounting period
PREFIX = "box-"


@dataclass(frozen=True)
class Layout:
    """Where task groups go: the version, and per controller the parent directory."""

    version: int
    memory: Path
    cpu: Path


@dataclass(frozen=True)
class Limits:
    memory_mb: int
    cpu_percent: int


def _own_paths() -> dict[str, str]:
    """This process's group per controller ("" for the v2 unified hierarchy)."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


def _mounts() -> dict[str, Path]:
    """Mount points: "" for cgroup2, and each v1 controller name for its hierarchy."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            found.setdefault("", Path(fields[1]))
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                found.setdefault(option, Path(fields[1]))
    return found


@functools.cache
def layout() -> Layout | str:
    """The layout task groups use, or the reason there is none."""
    if os.geteuid() != 0:
        return "the box is not running as root"
    try:
        own, mounts = _own_paths(), _mounts()
    except OSError as exc:
        return f"cannot read this process's control groups: {exc.strerror}"
    if "" in mounts and "" in own:
        parent = mounts[""] / own[""].lstrip("/")
        if _v2_delegated(parent):
            return Layout(2, parent, parent)
    if "memory" in mounts and "cpu" in mounts and "memory" in own and "cpu" in own:
        memory = mounts["memory"] / own["memory"].lstrip("/")
        cpu = mounts["cpu"] / own["cpu"].lstrip("/")
        if os.access(memory, os.W_OK) and os.access(cpu, os.W_OK):
            return Layout(1, memory, cpu)
    if "" in mounts:
        return ("cgroup v2's memory and cpu controllers are not delegated to the box's group "
                "(run the box in a systemd unit with Delegate=yes)")
    return "this system has no writable cgroup memory and cpu controllers"


def _v2_delegated(parent: Path) -> bool:
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
    return "memory" in enabled and "cpu" in enabled


def unavailable() -> str | None:
    """None when task limits on memory and CPU are enforced; otherwise why not."""
    found = layout()
    return found if isinstance(found, str) else None


def describe() -> str:
    found = layout()
    if isinstance(found, str):
        return f"not enforced: {found}"
    return f"cgroup v{found.version} (memory without swap, a CPU cap)"


def _groups(task_id: str, found: Layout) -> list[Path]:
    name = PREFIX + task_id
    if found.version == 2:
        return [found.memory / name]
    return [found.memory / name, found.cpu / name]


def prepare(task_id: str, limits: Limits) -> list[str]:
    """Create (or update) the task's groups with ``limits``; the ``cgroup.procs`` files its init
    joins. Empty when limits cannot be enforced here."""
    found = layout()
    if isinstance(found, str):
        return []
    groups = _groups(task_id, found)
    for group in groups:
        group.mkdir(mode=0o755, exist_ok=True)
    memory = limits.memory_mb * 1024 * 1024
    quota = max(1000, PERIOD_US * limits.cpu_percent // 100)
    if found.version == 2:
        group = groups[0]
        _write(group / "memory.max", str(memory))
        _write(group / "memory.swap.max", "0", optional=True)
        _write(group / "memory.oom.group", "1", optional=True)  # an OOM takes the whole task, not a random part
        _write(group / "cpu.max", f"{quota} {PERIOD_US}")
    else:
        memory_group, cpu_group = groups
        # memsw must stay >= the plain limit: lower or raise them in the order that keeps it so.
        memsw = memory_group / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            try:
                _write(memsw, str(memory))
                _write(memory_group / "memory.limit_in_bytes", str(memory))
            except OSError:
                _write(memory_group / "memory.limit_in_bytes", str(memory))
                _write(memsw, str(memory))
        else:
            _write(memory_group / "memory.limit_in_bytes", str(memory))
        _write(cpu_group / "cpu.cfs_period_us", str(PERIOD_US))
        _write(cpu_group / "cpu.cfs_quota_us", str(quota))
    return [str(group / "cgroup.procs") for group in groups]


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError:
        if not optional:
            raise


def memory_exhausted(task_id: str) -> bool:
    """True once the kernel's OOM killer has killed a process of the task (its memory limit)."""
    found = layout()
    if isinstance(found, str):
        return False
    group = found.memory / (PREFIX + task_id)
    source = group / ("memory.events" if found.version == 2 else "memory.oom_control")
    try:
        lines = source.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value) > 0
    return False


def remove(task_id: str, *, timeout: float = 10.0) -> None:
    """Remove the task's groups (after its processes are gone; idempotent)."""
    found = layout()
    if isinstance(found, str):
        return
    deadline = time.monotonic() + timeout
    for group in _groups(task_id, found):
        while True:
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                # EBUSY while the last killed processes are still leaving the group.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

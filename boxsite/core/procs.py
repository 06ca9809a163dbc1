"""Processes as /proc shows them: a process's state and parent, and the processes below one.

The cluster's stop uses it to find the workers it forked; the tests and benchmarks that watch a
box's processes use the same reading. A process that ends while it is being read is simply not
there: every function answers for the processes that exist at that moment.
"""
from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, parent, ...), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces and parentheses.
    return text.rsplit(")", 1)[1].split()


def state(pid: int) -> str | None:
    """The process's one-letter state ("R", "S", "Z", ...), or None when it is gone."""
    fields = _stat(pid)
    return fields[0] if fields else None


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    return state(pid) not in (None, "Z")


def parent(pid: int) -> int:
    """The process's parent, or 0 when it is gone."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def cpu_ticks(pid: int) -> int:
    """User plus system time the process has used, in clock ticks (0 when it is gone)."""
    fields = _stat(pid)
    return int(fields[11]) + int(fields[12]) if fields else 0


def parents() -> dict[int, int]:
    """Every process -> its parent."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            ppid = parent(int(entry.name))
            if ppid:
                found[int(entry.name)] = ppid
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    return sorted(child for child, ppid in parents().items() if ppid == pid)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, nearest first (its children, then theirs, ...)."""
    family = parents()
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {child for child, ppid in family.items() if ppid in frontier} - set(found)
        found.extend(sorted(frontier))
    return found


def count_named(names: frozenset[str]) -> int:
    """How many live processes run a program whose name (/proc/<pid>/comm) is one of ``names``."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry.name}/comm").read_text().strip()
        except OSError:
            continue
        if comm in names and alive(int(entry.name)):
            count += 1
    return count

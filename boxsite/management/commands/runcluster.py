"""The worker: a django-q2 cluster whose stop hands running runs back instead of losing them.

SIGTERM or SIGINT to this process (the cluster leader, and only it) stops the cluster: first
every worker process gets SIGUSR1, which stops the step in hand (its processes die) and hands
the run back to resume at the next start; then django-q2 stops its processes in order.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django_q.cluster import Cluster

from tasks.jobs import hand_back_on_signal

_SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found.extend(frontier)
    return found


def catches_sigusr1(pid: int) -> bool:
    """True for the cluster's own processes (they inherit the handler); a task's processes,
    started with exec, never do, so the signal cannot reach them."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & _SIGUSR1_BIT)
    except OSError:
        pass
    return False


class Command(BaseCommand):
    help = "Run the worker cluster; SIGTERM/SIGINT hand running runs back and stop it."

    def handle(self, *args: Any, **options: Any) -> None:
        settings.SECRET_KEY  # noqa: B018 - jobs are signed with it: fail now if it is missing
        # Installed before the cluster forks, so every worker process inherits it.
        signal.signal(signal.SIGUSR1, hand_back_on_signal)
        cluster = Cluster()

        def stop(signum: int, frame: object) -> None:
            for pid in descendants(os.getpid()):
                if catches_sigusr1(pid):
                    try:
                        os.kill(pid, signal.SIGUSR1)
                    except ProcessLookupError:
                        pass
            cluster.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        cluster.start()

"""The worker: a django-q2 cluster that hands running runs back when it stops, and restarts
itself when it stops claiming runs.

SIGTERM or SIGINT to this process (the cluster leader, and only it) stops the cluster: first
every worker process gets SIGUSR1, which stops the step in hand (its processes die) and hands
the run back to resume at the next start; then the cluster's processes end, and the leader
finishes the releases of ended tasks their janitors had not (``tasks.run.lifecycle.release_ended``).

Its own watchdog: every second the leader checks whether runs wait while the cluster claims
nothing (``tasks.run.leases.cluster_stuck``: a killed django-q2 worker can leave the queue's read
lock held for good, so every later run waits with no error). Then it logs it, stops the
cluster the same way (a cluster too wedged to stop within seconds is killed), starts a fresh
one and re-sends every unclaimed run. So a bare ``manage.py runcluster`` recovers by itself;
the supervisor (``runbox``) only restarts a leader that is wedged itself.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connections
from django_q.cluster import Cluster
from django_q.signals import post_spawn

from boxsite.core.beats import Beat
from boxsite.core.procs import descendants
from tasks import jobs
from tasks.machines.homes import MachineBeat
from tasks.models import Run, RunState
from tasks.run import leases as runs
from tasks.run import lifecycle
from tasks.run.worker import hand_back_on_signal

log = logging.getLogger("box.cluster")

_SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)
WATCH_EVERY_S = 1.0
# How long a stopping cluster gets before what is left of it is killed: a restart by the
# watchdog (the cluster is wedged), or a stop (the supervisor kills after its own grace).
RESTART_GRACE_S = 5.0


# What the workers run, imported here before the fork so that every worker shares its pages.
WORKER_ENTRY = jobs.execute_run

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


def hand_back_all() -> None:
    """SIGUSR1 to every process of the cluster: each worker stops its step and hands its run back."""
    for pid in descendants(os.getpid()):
        if catches_sigusr1(pid):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass


def name_worker(**_: Any) -> None:
    """A django-q2 worker, just forked, is called ``box-worker`` (``ps``, /proc/<pid>/comm), apart
    from the cluster's sentinel, monitor and pusher."""
    try:
        Path("/proc/self/comm").write_text("box-worker")
    except OSError:
        pass


def start_cluster(on_stop: Any) -> Cluster:
    # The cluster forks from this process: no database connection of ours may be inherited.
    connections.close_all()
    cluster = Cluster()
    # django-q2's Cluster takes SIGTERM/SIGINT for itself; the stop is this command's.
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    # What the workers inherit stays shared with this process: a frozen object is never visited
    # by a collection in a worker, which would otherwise write to (and so copy) its page.
    gc.collect()
    gc.freeze()
    cluster.start()
    return cluster


def _runs_in_hand(family: list[int]) -> bool:
    """Whether a process of the cluster still holds a running run (it is handing it back)."""
    close_old_connections()
    return Run.objects.filter(state=RunState.RUNNING, worker_host=socket.gethostname()[:255],
                              worker_pid__in=family).exists()


def stop_cluster(cluster: Cluster, grace: float) -> None:
    """Hand running runs back, then end the cluster's processes; kill what is left after ``grace``.

    Once no process of the cluster holds a run (each handed its own back), nothing in it is
    worth waiting for: a message it read and did not run is sent again at the next start, and a
    second delivery of a run does nothing. So it is killed then, instead of waiting for
    django-q2's orderly stop (slow even when idle: its pusher's poll, its monitor)."""
    hand_back_all()
    family = descendants(os.getpid())
    sentinel = cluster.sentinel
    if cluster.stop_event is not None:
        # In a thread of its own: setting the event takes a lock shared with the sentinel, which
        # a frozen sentinel may hold for ever.
        threading.Thread(target=cluster.stop_event.set, name="stop-cluster", daemon=True).start()
    deadline = time.monotonic() + grace
    while sentinel is not None and sentinel.is_alive() and time.monotonic() < deadline:
        try:
            if not _runs_in_hand(family):
                break
        except Exception:  # noqa: BLE001 - no database: let django-q2 stop in order, up to the grace
            log.warning("could not check for runs still in hand; waiting for the cluster", exc_info=True)
            sentinel.join(timeout=max(0.0, deadline - time.monotonic()))
            break
        time.sleep(0.05)
    left = [pid for pid in family if Path(f"/proc/{pid}").exists()]
    if left and time.monotonic() >= deadline:
        log.warning("the worker cluster did not stop within %gs; killing %d process(es)", grace, len(left))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if sentinel is not None:
        sentinel.join()
    # A worker's janitor releases a task after its final state, in the background: the kill cut
    # short whatever it had not finished (a view still mounted, a user not given back).
    close_old_connections()
    try:
        lifecycle.release_ended()
    except Exception:  # noqa: BLE001 - no database: the next start's reconcile releases them
        log.warning("could not finish the releases the stopped workers left; the next start will", exc_info=True)
    connections.close_all()


class Watchdog:
    """Judges a running cluster stuck (see ``tasks.run.leases.cluster_stuck``). A fresh cluster gets
    ``BOX_STUCK_S`` to come up before it is judged; each restart in a row doubles that (a
    machine too loaded to start one quickly must not be restarted in a loop), back to the base
    once a cluster has gone a while without needing one."""

    def __init__(self) -> None:
        self.base = self.grace = max(float(settings.BOX_STUCK_S), 2.0)
        self.started = time.monotonic()

    def restarted(self) -> None:
        self.started = time.monotonic()
        self.grace = min(2 * self.grace, 300.0)

    def stuck(self) -> bool:
        up = time.monotonic() - self.started
        if up <= self.grace:
            return False
        close_old_connections()
        try:
            stuck = runs.cluster_stuck()
        except Exception:  # noqa: BLE001 - a database hiccup is no reason to restart anything
            log.warning("could not check whether the worker cluster is stuck", exc_info=True)
            return False
        if not stuck and up > 2 * self.grace + 2 * self.base:
            self.grace = self.base  # it has been working for a while
        return stuck


def _machine_beat(machine: MachineBeat) -> None:
    close_old_connections()
    try:
        machine.due()
    except Exception:  # noqa: BLE001 - a database hiccup: the next beat tries again
        log.warning("could not write this machine's beat", exc_info=True)


class Command(BaseCommand):
    help = "Run the worker cluster; SIGTERM/SIGINT hand running runs back and stop it."
    # Django's checks import the URLconf, and with it every view, DRF and the schema generator:
    # web-only modules the workers, forked from this process, would all carry in their memory.
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        settings.SECRET_KEY  # noqa: B018 - jobs are signed with it: fail now if it is missing
        # Installed before the cluster forks, so every worker process inherits it.
        signal.signal(signal.SIGUSR1, hand_back_on_signal)
        post_spawn.connect(name_worker, dispatch_uid="box-name-worker")
        stopping = threading.Event()

        def on_stop(*_: Any) -> None:
            stopping.set()

        cluster = start_cluster(on_stop)
        watchdog = Watchdog()
        beat = Beat("worker")  # the leader's loop: it beats while it watches a cluster it runs
        machine = MachineBeat() if settings.BOX_MACHINE else None  # several machines: the others see it too
        beat.due()
        while not stopping.wait(WATCH_EVERY_S):
            beat.due()
            if machine is not None:
                _machine_beat(machine)
            sentinel_gone = cluster.sentinel is None or not cluster.sentinel.is_alive()
            if not sentinel_gone and not watchdog.stuck():
                continue
            if stopping.is_set():
                break
            if sentinel_gone:
                log.error("the worker cluster's sentinel died; starting a new cluster")
            else:
                log.error("runs have waited %gs while the worker cluster claimed none; restarting it",
                          settings.BOX_STUCK_S)
            stop_cluster(cluster, RESTART_GRACE_S)
            if stopping.is_set():
                return
            cluster = start_cluster(on_stop)
            watchdog.restarted()
            close_old_connections()
            try:
                runs.resend_unclaimed()
            except Exception:  # noqa: BLE001 - the scheduler re-sends them after BOX_RESEND_S too
                log.warning("could not re-send unclaimed runs after the restart", exc_info=True)
        stop_cluster(cluster, float(settings.BOX_STOP_GRACE_S))

"""Start the whole box: web (daphne), worker (the django-q2 cluster) and scheduler, supervised together.

Ctrl-C (or SIGTERM) stops all three gracefully: each gets SIGTERM (the cluster's leader alone,
which hands running runs back), anything still alive after ``BOX_STOP_GRACE_S`` is killed, and
then the box releases what its tasks held on the host (processes, task users, mounts). If one
of the three dies, the others are stopped too, so the box is never half up. The cluster leader
restarts a cluster that stops claiming runs while runs wait (``runcluster``'s watchdog); if runs
still wait three times as long (the leader itself is wedged), the supervisor restarts the worker
process (see ``tasks.run.leases.cluster_stuck``).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from boxsite.core import hostnames, setup_code
from tasks.run import leases as runs
from tasks.run import lifecycle
from tasks.sandbox import support

log = logging.getLogger("box.supervisor")

_PR_SET_PDEATHSIG = 1
WATCH_EVERY_S = 1.0


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the supervisor dies (even by SIGKILL), so a
    crashed supervisor never leaves a half box running."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    # Own sessions: Ctrl-C reaches only the supervisor, which stops the three in order.
    return subprocess.Popen(argv, cwd=settings.BASE_DIR, start_new_session=True, preexec_fn=_die_with_parent)


def stop_all(procs: dict[str, subprocess.Popen[bytes]], grace: float) -> dict[str, float]:
    """SIGTERM each process itself (never its group: a leader stops its own children in order);
    SIGKILL the whole group of any still alive after ``grace`` seconds. Returns how long each
    took to exit, in seconds (they stop side by side, so the stop takes the longest of them)."""
    began = time.monotonic()
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    took: dict[str, float] = {}

    def wait(name: str, proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("%s (process %s) did not stop within %gs; killing it", name, proc.pid, grace)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left (also after a clean exit)
        except ProcessLookupError:
            pass
        proc.wait()
        took[name] = time.monotonic() - began

    waiters = [threading.Thread(target=wait, args=item, name=f"stop-{item[0]}") for item in procs.items()]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join()
    return took


class Command(BaseCommand):
    help = "Run web + worker + scheduler."

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = settings.BOX_HOST, settings.BOX_PORT
        python = sys.executable
        manage = str(settings.BASE_DIR / "manage.py")
        children = {
            "web": [python, "-m", "daphne", "-b", host, "-p", str(port), "boxsite.asgi:application"],
            "worker": [python, manage, "runcluster"],
            "scheduler": [python, manage, "runscheduler"],
        }
        # The code is issued before the web process starts, so its setup page asks for this one.
        code = None if get_user_model().objects.filter(is_superuser=True).exists() else setup_code.issue()
        procs = {name: start(argv) for name, argv in children.items()}
        url = f"http://{host}:{port}/"
        self.stdout.write(f"\nThe box is running at {url}  (data: {settings.BOX_DATA_DIR})")
        sandbox = support.standing()
        self.stdout.write(f"  Sandbox: {sandbox.summary}")
        if sandbox.mode == "refused":
            self.stdout.write(f"  To run tasks: {support.FIX}")
            log.warning("tasks are refused: the box cannot sandbox them (%s); %s", sandbox.reason, support.FIX)
        if host.strip("[]") in ("0.0.0.0", "::"):
            for address in hostnames.own_addresses()[:3]:
                self.stdout.write(f"  on your network: http://{hostnames.as_host(address)}:{port}/")
        if code is not None:
            self.stdout.write(f"  First visit {url} to create the owner account, with the setup code {code}")
            self.stdout.write("  (it proves you started this box; it is spent once the owner exists),")
            self.stdout.write("  or: BOX_OWNER_PASSWORD=... .venv/bin/python manage.py createowner NAME")
        self.stdout.write("  API token: .venv/bin/python manage.py createtoken   (printed once)")
        self.stdout.write("  API docs:  " + url + "api/docs/")
        self.stdout.write("Press Ctrl-C to stop.\n")
        self.stdout.flush()

        stop = threading.Event()  # a signal wakes the watch loop at once
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        exit_code = 0
        started_worker = next_watch = time.monotonic()
        # A (re)started cluster gets time to come up before it is judged; on a loaded machine
        # that can take long, so each restart doubles it (back to the base once the cluster
        # has gone a while without needing one).
        wedged_s = 3 * settings.BOX_STUCK_S
        base_grace = grace = max(2 * wedged_s, 15.0)
        while not stop.is_set():
            for name, proc in procs.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with {proc.returncode}; stopping the box")
                    stop.set()
                    exit_code = 1
                    break
            now = time.monotonic()
            if not stop.is_set() and now >= next_watch:
                next_watch = now + WATCH_EVERY_S
                if now - started_worker > grace:
                    if self._cluster_stuck():
                        self.stderr.write(f"runs have waited {wedged_s:g}s while the worker cluster claimed none "
                                          "(its own watchdog did not restart it); restarting the worker process")
                        stop_all({"worker": procs["worker"]}, grace=min(5.0, settings.BOX_STOP_GRACE_S))
                        procs["worker"] = start(children["worker"])
                        started_worker = time.monotonic()
                        grace = min(2 * grace, 300.0)
                        runs.resend_unclaimed()
                    elif now - started_worker > 2 * grace:
                        grace = base_grace  # it has been working for a while
            stop.wait(0.2)
        self.stdout.write("Stopping: running steps are handed back, then the box releases what its tasks hold.")
        self.stdout.flush()
        began = time.monotonic()
        # The spare pool users go while the processes stop (a userdel each, no database).
        spare = threading.Thread(target=lifecycle.empty_spare_pool, name="empty-pool")
        spare.start()
        took = stop_all(procs, grace=settings.BOX_STOP_GRACE_S)
        spare.join()
        stopped = time.monotonic()
        close_old_connections()
        lifecycle.release_host()
        each = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in took.items())
        self.stdout.write(f"The box stopped in {time.monotonic() - began:.2f}s (its processes and the spare task users "
                          f"{stopped - began:.2f}s: {each}; releasing the host {time.monotonic() - stopped:.2f}s).")
        sys.exit(exit_code)

    def _cluster_stuck(self) -> bool:
        close_old_connections()
        try:
            return runs.cluster_stuck(for_s=3 * settings.BOX_STUCK_S)
        except Exception:  # noqa: BLE001 - a database hiccup is no reason to restart anything
            log.warning("could not check whether the worker cluster is stuck", exc_info=True)
            return False

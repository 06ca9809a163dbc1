"""Start the whole box: web (daphne), worker (qcluster) and scheduler, supervised together.

Ctrl-C (or SIGTERM) stops all three. If one of them dies, the others are stopped too, so the
box is never half up.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM if the supervisor dies (even by SIGKILL), so a
    crashed supervisor never leaves a half box running."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Command(BaseCommand):
    help = "Run web + worker + scheduler."

    def handle(self, *args: Any, **options: Any) -> None:
        host, port = settings.BOX_HOST, settings.BOX_PORT
        python = sys.executable
        manage = str(settings.BASE_DIR / "manage.py")
        children = {
            "web": [python, "-m", "daphne", "-b", host, "-p", str(port), "boxsite.asgi:application"],
            "worker": [python, manage, "qcluster"],
            "scheduler": [python, manage, "runscheduler"],
        }
        procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, argv in children.items():
            # Own sessions: Ctrl-C reaches only the supervisor, which stops the three in order.
            procs[name] = subprocess.Popen(argv, cwd=settings.BASE_DIR, start_new_session=True, preexec_fn=_die_with_parent)
        url = f"http://{host}:{port}/"
        self.stdout.write(f"\nThe box is running at {url}  (data: {settings.BOX_DATA_DIR})")
        if not get_user_model().objects.filter(is_superuser=True).exists():
            self.stdout.write(f"  First visit {url} to create the owner account,")
            self.stdout.write("  or: BOX_OWNER_PASSWORD=... .venv/bin/python manage.py createowner NAME")
        self.stdout.write("  API token: .venv/bin/python manage.py createtoken   (printed once)")
        self.stdout.write("  API docs:  " + url + "api/docs/")
        self.stdout.write("Press Ctrl-C to stop.\n")
        self.stdout.flush()

        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exit_code = 0
        while not stopping:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with {proc.returncode}; stopping the box")
                    stopping, exit_code = True, 1
                    break
            time.sleep(0.2)
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.stdout.write("The box stopped.")
        sys.exit(exit_code)

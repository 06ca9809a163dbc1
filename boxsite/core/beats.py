"""The box's processes say they are alive: the worker cluster's leader and the scheduler each
touch a file under ``BOX_DATA_DIR/heartbeats`` every ``BOX_BEAT_S`` from their loops, and
``/api/health`` reads the files' ages. A file, not a row: a beat must not write to a database
it may be reporting as busy, and an idle box's database stays quiet. The file is named by role
and machine (``worker.<host>``), so machines sharing one data directory each keep their own;
a role is alive while any machine's file of it is fresh."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Literal, TypedDict

from django.conf import settings

Role = Literal["worker", "scheduler"]
ROLES: tuple[Role, ...] = ("worker", "scheduler")


class Liveness(TypedDict):
    state: Literal["alive", "stale", "never"]
    ok: bool
    ageSeconds: float | None


def _dir() -> Path:
    return Path(settings.BOX_DATA_DIR) / "heartbeats"


class Beat:
    """One process's heartbeat: ``due()`` from its loop touches the file when ``BOX_BEAT_S``
    has passed since the last touch (the first call always does)."""

    def __init__(self, role: Role) -> None:
        self.path = _dir() / f"{role}.{socket.gethostname()}"
        self.last = float("-inf")

    def due(self) -> None:
        now = time.monotonic()
        if now - self.last < settings.BOX_BEAT_S:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(f"{os.getpid()}\n")
        except OSError:
            return  # a full or read-only data dir: health shows it stale, which is the truth
        self.last = now


def liveness(role: Role) -> Liveness:
    """How long ago a process of ``role`` last beat, on any machine; stale past ``BOX_BEAT_STALE_S``."""
    ages = []
    for path in _dir().glob(f"{role}.*"):
        try:
            ages.append(max(0.0, time.time() - path.stat().st_mtime))
        except OSError:
            continue
    if not ages:
        return {"state": "never", "ok": False, "ageSeconds": None}
    age = round(min(ages), 1)
    fresh = age <= settings.BOX_BEAT_STALE_S
    return {"state": "alive" if fresh else "stale", "ok": fresh, "ageSeconds": age}

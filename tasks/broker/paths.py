"""Where a task's broker socket is, and where the ``box`` client is installed.

The client is a stdlib-only script run by the system ``/usr/bin/python3`` (task users cannot read
the box's virtualenv). It is installed to ``CLIENT_DIR/<digest>/box``, one directory per version
of the client (two boxes on one machine, or the old and new processes of an upgrade, never
replace each other's), which the sandbox puts first on ``PATH``; a box that cannot write there
(not root) installs it under ``BOX_DATA_DIR/bin/<digest>`` instead.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tasks.sandbox.paths import BOX_BIN_DIR, runtime_dir

CLIENT_DIR = BOX_BIN_DIR
CLIENT_SOURCE = Path(__file__).resolve().parent / "client" / "box"
SOCKET_NAME = "broker.sock"
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


def socket_path(task_id: str) -> Path:
    return runtime_dir(task_id) / SOCKET_NAME  # the sandbox's per-task runtime directory


def short_address(path: Path, dir_fd: int) -> str:
    """An address for ``path`` that fits a Unix socket address (108 bytes): the path itself, or
    the same file reached through ``dir_fd`` (an open descriptor of its directory) in /proc."""
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return str(path)
    return f"/proc/self/fd/{dir_fd}/{path.name}"


@lru_cache(maxsize=1)
def client_dir() -> Path:
    """Install the ``box`` client (once per process) and return the directory that holds it."""
    digest = hashlib.sha256(CLIENT_SOURCE.read_bytes()).hexdigest()[:16]
    for directory in (CLIENT_DIR / digest, Path(settings.BOX_DATA_DIR) / "bin" / digest):
        try:
            _install(directory)
        except PermissionError:
            continue
        return directory
    raise ImproperlyConfigured(f"cannot install the box client into {CLIENT_DIR} or the data directory")


def _install(directory: Path) -> None:
    target = directory / "box"
    source = CLIENT_SOURCE.read_bytes()
    if target.is_file() and target.read_bytes() == source:
        return
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory.parent, 0o755)
    os.chmod(directory, 0o755)
    partial = directory / f".box.{os.getpid()}"
    shutil.copyfile(CLIENT_SOURCE, partial)
    os.chmod(partial, 0o755)
    os.replace(partial, target)  # atomic: a task never runs a half-written client


def process_env(task_id: str) -> dict[str, str]:
    """What a task's process needs to reach its broker: the socket and the client on PATH."""
    return {"BOX_BROKER_SOCKET": str(socket_path(task_id)), "BOX_CLIENT_DIR": str(client_dir())}

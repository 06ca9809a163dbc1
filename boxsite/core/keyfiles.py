"""Key files the box generates once into its data directory (Django's signing key, the vault key).

Several processes start together on a fresh data directory (the web process, workers, the
scheduler): each may find no key file and generate one. ``create_once`` makes exactly one of
them win and every process read the winner's key: the key is written whole to a private file
of the writer's own, then hard-linked into place, which fails for every writer but the first.
A reader never sees an empty or half-written key file.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path


def create_once(path: Path, content: bytes) -> bool:
    """Make ``path`` (0600) hold ``content`` unless it already exists. True if this call created
    it; False if another process (or an earlier start) did, whose content is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:
            return False
        return True
    finally:
        partial.unlink(missing_ok=True)


def read_or_create(path: Path, generate: bytes) -> bytes:
    """The content of ``path``; when it does not exist yet, ``generate`` becomes it (or another
    process's content does, if that process was first)."""
    if not os.path.lexists(path):
        create_once(path, generate)
    return path.read_bytes()

"""Which files of the data directory a backup holds, and in what order.

Kept: workspaces' bases (``workspaces/``), every task's layer (``layers/<task>/``), compacted
layers (``flats/``), artifacts, uploads (a layer like any other), the vault key, Django's signing
key, and whatever else the box keeps there. Left out: what belongs to a running machine and is
made again at start (views and mount points, sockets, locks, heartbeats, the pool of task users,
the queue's wake-ups, spare disk images, installed binaries, collected static files) and the
database's own files, which the backup takes through the database (``database``).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

# Top-level entries of the data directory that are this machine's running state.
RUNNING_STATE = frozenset({"tasks", "mounts", "run", "trash", "heartbeats", "locks", "queue-wake", "users", "bin",
                           "static", "browser-profiles"})
# Inside one task's layer: the disk limit's image and its mount point, and overlayfs' workdir.
# A finished layer has none of them (the seal settles the changes into upper/).
LAYER_RUNNING_STATE = frozenset({"disk.img", "disk", "ovl-work"})


@dataclass(frozen=True)
class LayerDir:
    task_id: str
    path: Path


def database_files() -> set[Path]:
    """SQLite's files (the database, its journal, its writer gate), never copied as files."""
    if settings.DB_IS_POSTGRES:
        return set()
    name = Path(settings.DATABASES["default"]["NAME"])
    return {Path(f"{name}{suffix}") for suffix in ("", "-wal", "-shm", "-gate", "-journal")}


def top_level(data: Path) -> Iterator[Path]:
    """The data directory's own entries that are copied as whole trees (``layers`` aside)."""
    skip = database_files()
    for entry in sorted(os.scandir(data), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.name in RUNNING_STATE or entry.name in ("layers", "flats") or path in skip:
            continue
        if entry.name.startswith(("test.sqlite3", ".")):  # a test run's database; temporary files
            continue
        yield path


def layers(data: Path) -> Iterator[LayerDir]:
    root = data / "layers"
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return
    for entry in entries:
        # A dot: spare disk images, probes of kernel features, files set aside; never a task's.
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
            yield LayerDir(entry.name, Path(entry.path))


def flats(data: Path) -> Iterator[tuple[int, Path]]:
    """Each workspace's compacted layers (``flats/<workspace id>/``)."""
    try:
        entries = sorted(os.scandir(data / "flats"), key=lambda e: e.name)
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.isdigit() and entry.is_dir(follow_symlinks=False):
            yield int(entry.name), Path(entry.path)


def walk(top: Path, *, skip_in_top: frozenset[str] = frozenset()) -> Iterator[Path]:
    """``top`` and everything under it, parents before children, symlinks not followed, and
    nothing whose name starts with a dot at ``top``'s own level when ``skip_in_top`` holds ".";
    a file that vanishes meanwhile is not an error (the box goes on while it is backed up)."""
    yield top
    if not top.is_dir() or top.is_symlink():
        return
    stack = [(top, skip_in_top)]
    while stack:
        directory, skip = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name, reverse=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in reversed(entries):
            if entry.name in skip or ("." in skip and entry.name.startswith(".")):
                continue
            path = Path(entry.path)
            yield path
            if entry.is_dir(follow_symlinks=False):
                stack.append((path, frozenset()))

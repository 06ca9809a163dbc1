"""Compaction: deep stacks get a cached flattened lower layer.

overlayfs takes a bounded number of lower directories (and one page of mount options), and
every extra layer costs a lookup on each path. When a stack holds more than
``BOX_LAYER_MAX_DEPTH`` layers, its oldest layers are merged into one *flat* layer (itself a
layer: whiteouts kept, so the base stays a separate, live lower directory).

The split point moves in steps of half the depth, so a flat stays valid while new layers pile
up on top, and a new flat is built from the longest cached one it extends (files are shared by
hard links: layers never change once sealed). Flats are keyed by the exact layer ids they hold:
undoing a layer beneath a flat changes the key, so the next task gets a rebuilt flat, while a
task still running keeps the flat it mounted until it ends.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from django.conf import settings

from tasks.layers import paths
from tasks.layers.locks import workspace_lock
from tasks.layers.tree import LayerTree, Markers, Meta, NativeMarkers, PortableMarkers, apply_layer, copy_layer, write_atomically
from tasks.models import Workspace


def max_depth() -> int:
    return max(2, int(settings.BOX_LAYER_MAX_DEPTH))


def flattened_count(count: int) -> int:
    """How many of the oldest of ``count`` layers go into the flat (0: no flat needed)."""
    depth = max_depth()
    if count <= depth:
        return 0
    step = max(1, depth // 2)
    return ((count - 1) // step) * step


def flat_key(oldest_first: list[str], markers: str) -> str:
    return hashlib.sha256(f"{markers}\n{','.join(oldest_first)}".encode()).hexdigest()[:24]


def split(newest_first: list[str], markers: str) -> tuple[list[str], str | None, list[str]]:
    """(layers stacked on their own, the flat's key or None, the layers inside the flat)."""
    flat = flattened_count(len(newest_first))
    if not flat:
        return newest_first, None, []
    oldest_first = list(reversed(newest_first))
    inside = oldest_first[:flat]
    return newest_first[: len(newest_first) - flat], flat_key(inside, markers), inside


def lower_trees(workspace: Workspace, newest_first: list[str], markers: str) -> list[LayerTree]:
    """The lower directories a task mounts, newest first, the base last. Builds a missing flat
    (takes the workspace lock); the layers must already be sealed."""
    own, key, inside = split(newest_first, markers)
    trees = [LayerTree.of_layer(paths.layer_dir(task_id)) for task_id in own]
    if key is not None:
        with workspace_lock(workspace.pk):
            trees.append(LayerTree.of_layer(ensure_flat(workspace, inside, markers)))
    base = workspace.base_path()
    base.mkdir(parents=True, exist_ok=True)
    trees.append(LayerTree(base, plain=True))
    return trees


def _read_ids(directory: Path) -> list[str] | None:
    try:
        ids: list[str] = json.loads((directory / "ids.json").read_text())
        return ids
    except (FileNotFoundError, ValueError):
        return None


def ensure_flat(workspace: Workspace, oldest_first: list[str], markers: str) -> Path:
    """The flat holding exactly ``oldest_first``; built if missing. Hold the workspace lock."""
    root = paths.private_dir(paths.flats_dir(workspace.pk))
    key = flat_key(oldest_first, markers)
    target = root / key
    if (target / "ids.json").exists():
        return target
    start: Path | None = None
    start_len = 0
    for candidate in root.iterdir():
        ids = _read_ids(candidate)
        if ids is None or len(ids) <= start_len or ids != oldest_first[: len(ids)]:
            continue
        if Meta.load(candidate).format != markers:
            continue
        start, start_len = candidate, len(ids)
    build = root / f".build-{key}-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    meta = Meta(format=markers, driver="flat", sealed=True)
    writer: Markers = NativeMarkers() if markers == "native" else PortableMarkers(meta)
    (build / "upper").mkdir(parents=True)
    if start is not None:
        copy_layer(LayerTree.of_layer(start), build / "upper", writer)
    for task_id in oldest_first[start_len:]:
        apply_layer(LayerTree.of_layer(paths.layer_dir(task_id)), build / "upper", writer, share=True)
    meta.save(build)
    write_atomically(build / "ids.json", json.dumps(oldest_first).encode())
    os.rename(build, target)
    return target


def sweep_flats(workspace: Workspace, keep: set[str]) -> int:
    """Delete flats no stack needs any more. Hold the workspace lock."""
    root = paths.flats_dir(workspace.pk)
    if not root.is_dir():
        return 0
    removed = 0
    for candidate in root.iterdir():
        if candidate.name not in keep:
            shutil.rmtree(candidate, ignore_errors=True)
            removed += 1
    return removed

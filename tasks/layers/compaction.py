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

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from tasks.layers import paths
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
    """The lower directories a task mounts, newest first, the base last. Builds a missing flat;
    ``to_seal`` layers must already be sealed. No workspace lock and no hold: call this only
    from a task's start, after it recorded its stack under that lock (``stack_record.record_layer``), so
    every sweep from then on finds it active, reading this flat, and keeps it
    (``refresh_workspace``). A reader with no record uses ``held_lower_trees``."""
    own, key, inside = split(newest_first, markers)
    trees = [LayerTree.of_layer(paths.layer_dir(task_id)) for task_id in own]
    if key is not None:
        trees.append(LayerTree.of_layer(ensure_flat(workspace, inside, markers)))
    return [*trees, _base_tree(workspace)]


@contextmanager
def held_lower_trees(workspace: Workspace, newest_first: list[str], markers: str) -> Iterator[list[LayerTree]]:
    """``lower_trees`` for a reader no task recorded (the workspace browse): the flat is held
    shared until the block ends, so a sweep (whose stack may already be another) leaves it."""
    own, key, inside = split(newest_first, markers)
    trees = [LayerTree.of_layer(paths.layer_dir(task_id)) for task_id in own]
    held = -1
    if key is not None:
        while held < 0:  # swept between its build and the hold: built again
            flat = ensure_flat(workspace, inside, markers)
            held = _hold(flat, fcntl.LOCK_SH)
        trees.append(LayerTree.of_layer(flat))
    try:
        yield [*trees, _base_tree(workspace)]
    finally:
        if held >= 0:
            os.close(held)


def _base_tree(workspace: Workspace) -> LayerTree:
    base = workspace.base_path()
    base.mkdir(parents=True, exist_ok=True)
    return LayerTree(base, plain=True)


def to_seal(workspace: Workspace, newest_first: list[str], markers: str) -> list[str]:
    """The layers of a stack that must be sealed before a task mounts it: those stacked on
    their own, and those its flat is built from when it is missing, beyond the longest cached
    flat it extends. A cached flat holds only sealed layers (``ensure_flat``), and a sealed
    layer in a stack stays sealed (only a failed task's layer is reopened): at most about
    ``max_depth`` layers whatever the number of done tasks."""
    own, key, inside = split(newest_first, markers)
    if key is None:
        return own
    root = paths.flats_dir(workspace.pk)
    if (root / key / "ids.json").exists():
        return own
    _, start_len = _longest_cached(root, inside, markers)
    return [*own, *inside[start_len:]]


@contextmanager
def read_trees(workspace: Workspace | None, newest_first: list[str]) -> Iterator[list[LayerTree]]:
    """The layers of a stack as trees to read (newest first, no base), for the seal's
    comparisons with what lies beneath: the layers above the longest cached flat the stack
    begins with, then that flat, which resolves every path as its layers would. The flat is
    held (a shared ``flock`` on its directory) while the caller reads it: ``sweep_flats`` leaves
    a held flat alone, so it is not deleted under the reader."""
    oldest_first = list(reversed(newest_first))
    start: Path | None = None
    start_len, held = 0, -1
    if workspace is not None and newest_first:
        start, start_len, held = _hold_longest(paths.flats_dir(workspace.pk), oldest_first, None)
    try:
        trees = [LayerTree.of_layer(paths.layer_dir(task_id)) for task_id in reversed(oldest_first[start_len:])]
        if start is not None:
            trees.append(LayerTree.of_layer(start))
        yield trees
    finally:
        if held >= 0:
            os.close(held)


def _hold(flat: Path, operation: int) -> int:
    """An fd holding ``flock(operation)`` on the flat's directory while it is complete, or -1
    (deleted meanwhile, or held the other way with ``LOCK_NB``)."""
    try:
        fd = os.open(flat, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1
    try:
        fcntl.flock(fd, operation)
        os.stat("ids.json", dir_fd=fd)
    except OSError:
        os.close(fd)
        return -1
    return fd


def _read_ids(directory: Path) -> list[str] | None:
    try:
        ids: list[str] = json.loads((directory / "ids.json").read_text())
        return ids
    except (FileNotFoundError, ValueError):
        return None


def _longest_cached(root: Path, oldest_first: list[str], markers: str | None) -> tuple[Path | None, int]:
    """The longest complete flat in ``root`` whose layers begin ``oldest_first`` (any marker
    spelling when ``markers`` is None), and how many layers it holds."""
    start: Path | None = None
    start_len = 0
    try:
        candidates = list(root.iterdir())
    except FileNotFoundError:
        return None, 0
    for candidate in candidates:
        if candidate.name.startswith("."):
            continue
        ids = _read_ids(candidate)
        if ids is None or len(ids) <= start_len or ids != oldest_first[: len(ids)]:
            continue
        if markers is not None and Meta.load(candidate).format != markers:
            continue
        start, start_len = candidate, len(ids)
    return start, start_len


def ensure_flat(workspace: Workspace, oldest_first: list[str], markers: str) -> Path:
    """The flat holding exactly ``oldest_first``; built if missing. No lock needed: the build is
    held (an exclusive ``flock`` on its directory, which ``sweep_flats`` leaves alone), the flat
    it extends is held shared while it is read, and the build is renamed into place complete; of
    two builders of one flat, the first rename wins and the other's build is dropped. What keeps
    the flat once in place is the caller's: a task that recorded the stack it reads, or the
    workspace lock held around this call and the use."""
    root = paths.private_dir(paths.flats_dir(workspace.pk))
    key = flat_key(oldest_first, markers)
    target = root / key
    if (target / "ids.json").exists():
        return target
    start, start_len, held_start = _hold_longest(root, oldest_first, markers)
    try:
        unsealed = [task_id for task_id in oldest_first[start_len:]
                    if not Meta.load(paths.layer_dir(task_id)).sealed and paths.layer_dir(task_id).is_dir()]
        if unsealed:
            raise RuntimeError(f"a flat holds sealed layers only; not sealed yet: {', '.join(unsealed)}")
        build, held_build = _new_build(root, key)
        try:
            meta = Meta(format=markers, driver="flat", sealed=True)
            writer: Markers = NativeMarkers() if markers == "native" else PortableMarkers(meta)
            (build / "upper").mkdir()
            if start is not None:
                copy_layer(LayerTree.of_layer(start), build / "upper", writer)
            for task_id in oldest_first[start_len:]:
                apply_layer(LayerTree.of_layer(paths.layer_dir(task_id)), build / "upper", writer, share=True)
            meta.save(build)
            write_atomically(build / "ids.json", json.dumps(oldest_first).encode())
            try:
                os.rename(build, target)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                shutil.rmtree(build)  # another builder's flat is in place: the same layers
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)  # a failed build (ENOSPC, I/O): its name never comes again
            raise
        finally:
            os.close(held_build)
    finally:
        if held_start >= 0:
            os.close(held_start)
    return target


def _hold_longest(root: Path, oldest_first: list[str], markers: str | None) -> tuple[Path | None, int, int]:
    """The longest complete flat ``oldest_first`` begins with (any marker spelling when
    ``markers`` is None), its number of layers, and an fd holding it shared while the caller
    reads it (-1 with no such flat)."""
    while True:
        start, start_len = _longest_cached(root, oldest_first, markers)
        if start is None:
            return None, 0, -1
        held = _hold(start, fcntl.LOCK_SH)
        if held >= 0:
            return start, start_len, held


def _new_build(root: Path, key: str) -> tuple[Path, int]:
    """A new directory to build the flat ``key`` in, and an fd holding it exclusively (a sweep
    may delete it between its making and the lock: then another is made)."""
    while True:
        build = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
        try:
            fd = os.open(build, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            now = os.stat(build)
        except FileNotFoundError:
            now = None
        held = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return build, fd
        os.close(fd)  # deleted before the lock: not ours any more


def sweep_flats(workspace: Workspace, keep: set[str]) -> int:
    """Delete flats no stack needs any more. Hold the workspace lock."""
    root = paths.flats_dir(workspace.pk)
    if not root.is_dir():
        return 0
    removed = 0
    for candidate in root.iterdir():
        if candidate.name in keep:
            continue
        held = _hold_alone(candidate)
        if held < 0:
            continue  # read (``read_trees``, a build extending it) or being built: a later sweep
        try:
            shutil.rmtree(candidate, ignore_errors=True)
            removed += 1
        finally:
            os.close(held)
    return removed


def sweep_wanted(workspace: Workspace, keep: set[str]) -> bool:
    """Whether the workspace's flats directory holds anything besides ``keep`` (a flat, or a
    build, that a sweep might delete). Read without the lock: a caller that skips a sweep on
    False leaves the rest to a later one."""
    try:
        return any(entry.name not in keep for entry in os.scandir(paths.flats_dir(workspace.pk)))
    except FileNotFoundError:
        return False


def _hold_alone(candidate: Path) -> int:
    """An fd holding ``candidate`` exclusively, or -1 when another holds it (or it is gone, or
    not a directory)."""
    try:
        fd = os.open(candidate, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1  # gone, or not a directory (a stray file): nothing of ours to delete
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    return fd

"""Compaction: deep stacks get cached flattened lower layers.

overlayfs takes a bounded number of lower directories (and one page of mount options), and
every extra layer costs a lookup on each path. When a stack holds more than
``BOX_LAYER_MAX_DEPTH`` layers, its oldest layers are merged into *flats* (each itself a
layer: whiteouts kept, so what lies beneath, down to the base, stays a separate, live lower
directory).

The split point moves in steps of half the depth, so the flats stay valid while new layers
pile up on top. The layers beneath the split are cut into runs whose lengths are the binary
digits of their count in steps (oldest first, the longest first), each run one flat: as the
split moves, only the newest runs change, and a run of ``2k`` steps is built from the two runs
of ``k`` it replaces. A file is so copied about log2(layers / step) times over a workspace's
life, not once per step as one flat over everything would need (each step's flat a copy of the
whole history, growing with the workspace). The other half of the
depth bounds the number of flats: past it, the newest runs are one flat. Files are shared by
hard links (layers never change once sealed). Flats are keyed by the exact layer ids they hold:
undoing a layer beneath a flat changes the keys of that flat and of every newer one, so the next
task gets them rebuilt, while a task still running keeps the flats it mounted until it ends.
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
from typing import NamedTuple

from django.conf import settings

from tasks.layers import paths
from tasks.layers.tree import LayerTree, Markers, Meta, NativeMarkers, PortableMarkers, apply_layer, write_atomically
from tasks.models import Workspace


def max_depth() -> int:
    return max(2, int(settings.BOX_LAYER_MAX_DEPTH))


def flattened_count(count: int) -> int:
    """How many of the oldest of ``count`` layers go into flats (0: no flat needed)."""
    depth = max_depth()
    if count <= depth:
        return 0
    step = max(1, depth // 2)
    return ((count - 1) // step) * step


def run_lengths(flattened: int) -> list[int]:
    """The lengths of the runs ``flattened`` layers are cut into, oldest first: the binary
    digits of their count in steps, at most ``max_depth() - step`` runs (the newest merged)."""
    depth = max_depth()
    step = max(1, depth // 2)
    units = flattened // step
    lengths = [1 << bit for bit in reversed(range(units.bit_length())) if units >> bit & 1]
    slots = max(1, depth - step)
    if len(lengths) > slots:
        lengths[slots - 1:] = [sum(lengths[slots - 1:])]
    return [length * step for length in lengths]


def flat_key(oldest_first: list[str], markers: str) -> str:
    return hashlib.sha256(f"{markers}\n{','.join(oldest_first)}".encode()).hexdigest()[:24]


class Flat(NamedTuple):
    key: str
    layers: list[str]  # oldest first, as its ``ids.json`` lists them


def split(newest_first: list[str], markers: str) -> tuple[list[str], list[Flat]]:
    """(the layers stacked on their own, newest first; the flats beneath them, newest first)."""
    flattened = flattened_count(len(newest_first))
    if not flattened:
        return newest_first, []
    oldest_first = list(reversed(newest_first))
    flats: list[Flat] = []
    start = 0
    for length in run_lengths(flattened):
        inside = oldest_first[start:start + length]
        flats.append(Flat(flat_key(inside, markers), inside))
        start += length
    return newest_first[: len(newest_first) - flattened], flats[::-1]


def mounted_keys(newest_first: list[str], markers: str) -> set[str]:
    """The flats a task that recorded this stack may have mounted, which a sweep keeps while it
    is active: its runs, and the one flat over every layer below the split that a box version
    without runs builds, for a worker of that version still running it beside this one (a
    rolling upgrade of several machines)."""
    _, flats = split(newest_first, markers)
    keys = {flat.key for flat in flats}
    flattened = flattened_count(len(newest_first))
    if flattened:
        keys.add(flat_key(list(reversed(newest_first))[:flattened], markers))
    return keys


def layers_inside(flats: list[Flat]) -> list[str]:
    """The layers held by ``flats`` (newest first, as ``split`` gives them), newest first."""
    return [task_id for flat in flats for task_id in reversed(flat.layers)]


def lower_trees(workspace: Workspace, newest_first: list[str], markers: str) -> list[LayerTree]:
    """The lower directories a task mounts, newest first, the base last. Builds missing flats;
    ``to_seal`` layers must already be sealed. No workspace lock and no hold: call this only
    from a task's start, after it recorded its stack under that lock (``stack_record.record_layer``), so
    every sweep from then on finds it active, reading these flats, and keeps them
    (``refresh_workspace``). A reader with no record uses ``held_lower_trees``."""
    own, flats = split(newest_first, markers)
    trees = [LayerTree.of_layer(paths.layer_dir(task_id)) for task_id in own]
    trees += [LayerTree.of_layer(ensure_flat(workspace, flat.layers, markers)) for flat in flats]
    return [*trees, _base_tree(workspace)]


@contextmanager
def held_lower_trees(workspace: Workspace, newest_first: list[str], markers: str) -> Iterator[list[LayerTree]]:
    """``lower_trees`` for a reader no task recorded (the workspace browse): the flats are held
    shared until the block ends, so a sweep (whose stack may already be another) leaves them."""
    own, flats = split(newest_first, markers)
    trees = [LayerTree.of_layer(paths.layer_dir(task_id)) for task_id in own]
    holds: list[int] = []
    try:
        for flat in flats:
            held = -1
            while held < 0:  # swept between its build and the hold: built again
                path = ensure_flat(workspace, flat.layers, markers)
                held = _hold(path, fcntl.LOCK_SH)
            holds.append(held)
            trees.append(LayerTree.of_layer(path))
        yield [*trees, _base_tree(workspace)]
    finally:
        for held in holds:
            os.close(held)


def _base_tree(workspace: Workspace) -> LayerTree:
    base = workspace.base_path()
    base.mkdir(parents=True, exist_ok=True)
    return LayerTree(base, plain=True)


def to_seal(workspace: Workspace, newest_first: list[str], markers: str) -> list[str]:
    """The layers of a stack that must be sealed before a task mounts it: those stacked on
    their own, and those a missing flat is built from, beyond the cached flats it can be built
    from (``ensure_flat``). A cached flat holds only sealed layers, and a sealed layer in a
    stack stays sealed (only a failed task's layer is reopened): at most about ``max_depth``
    layers whatever the number of done tasks."""
    own, flats = split(newest_first, markers)
    root = paths.flats_dir(workspace.pk)
    needed = list(own)
    for flat in flats:
        if not (root / flat.key / "ids.json").exists():
            needed += [part for part in _cover(root, flat.layers, markers) if isinstance(part, str)]
    return needed


@contextmanager
def read_trees(workspace: Workspace | None, newest_first: list[str]) -> Iterator[list[LayerTree]]:
    """The layers of a stack as trees to read (newest first, no base), for the seal's
    comparisons with what lies beneath: from the oldest up, the longest cached flat that begins
    at each point (which resolves every path as its layers would), else the layer itself. The
    flats are held (a shared ``flock`` on each directory) while the caller reads them:
    ``sweep_flats`` leaves a held flat alone, so it is not deleted under the reader."""
    oldest_first = list(reversed(newest_first))
    parts: list[Path | str] = [*oldest_first]
    holds: list[int] = []
    if workspace is not None and newest_first:
        parts, holds = _held_cover(paths.flats_dir(workspace.pk), oldest_first, None)
    try:
        yield [LayerTree.of_layer(part if isinstance(part, Path) else paths.layer_dir(part)) for part in reversed(parts)]
    finally:
        for held in holds:
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


# What each complete flat holds, by directory name: its key, so what it names never changes
# (a flat deleted and built again holds the same layers in the same spelling).
_CACHED_MAX = 4096
_cached: dict[str, tuple[list[str], str]] = {}


def _complete_flats(root: Path) -> list[tuple[Path, list[str], str]]:
    """The complete flats in ``root``: each with its layers (oldest first) and marker spelling."""
    try:
        names = [entry.name for entry in os.scandir(root) if not entry.name.startswith(".")]
    except FileNotFoundError:
        return []
    found: list[tuple[Path, list[str], str]] = []
    for name in names:
        known = _cached.get(name)
        if known is not None and not os.path.exists(root / name / "ids.json"):
            continue  # being swept
        if known is None:
            try:
                ids = json.loads((root / name / "ids.json").read_text())
            except (OSError, ValueError):
                continue  # being built or swept, or a stray file
            if not isinstance(ids, list) or not ids or not all(isinstance(task_id, str) for task_id in ids):
                continue  # not a flat the box wrote: it covers nothing
            if not os.path.exists(root / name / "meta.json"):
                continue  # being swept (its spelling would read as the default)
            known = (ids, Meta.load(root / name).format)
            if len(_cached) >= _CACHED_MAX:
                _cached.clear()
            _cached[name] = known
        found.append((root / name, *known))
    return found


def _cover(root: Path, oldest_first: list[str], markers: str | None) -> list[Path | str]:
    """``oldest_first`` as cached flats and layers, oldest first: at each point the longest
    complete flat in ``root`` that begins there (any marker spelling when ``markers`` is None),
    else the layer itself. Nothing held: ``_held_cover`` for a cover to read."""
    return _held_cover(root, oldest_first, markers, hold=False)[0]


def _held_cover(root: Path, oldest_first: list[str], markers: str | None, *,
                hold: bool = True) -> tuple[list[Path | str], list[int]]:
    """``_cover``, each flat in it held shared (the fds: the caller closes them). A flat swept
    between the listing and its hold is left out: its layers are taken another way."""
    candidates = [(path, ids) for path, ids, spelling in _complete_flats(root) if markers is None or spelling == markers]
    parts: list[Path | str] = []
    holds: list[int] = []
    start = 0
    try:
        while start < len(oldest_first):
            best: tuple[Path, list[str]] | None = None
            for path, ids in candidates:
                if (best is None or len(ids) > len(best[1])) and ids == oldest_first[start:start + len(ids)]:
                    best = (path, ids)
            if best is None:
                parts.append(oldest_first[start])
                start += 1
                continue
            if hold:
                held = _hold(best[0], fcntl.LOCK_SH)
                if held < 0:
                    candidates.remove(best)
                    continue
                holds.append(held)
            parts.append(best[0])
            start += len(best[1])
    except BaseException:
        for held in holds:
            os.close(held)
        raise
    return parts, holds


def ensure_flat(workspace: Workspace, oldest_first: list[str], markers: str) -> Path:
    """The flat holding exactly ``oldest_first``; built if missing, from the cached flats that
    cover runs of it (``_held_cover``) and its other layers. No lock needed: the build is held
    (an exclusive ``flock`` on its directory, which ``sweep_flats`` leaves alone), the flats it
    is built from are held shared while they are read, and the build is renamed into place
    complete; of two builders of one flat, the first rename wins and the other's build is
    dropped. What keeps the flat once in place is the caller's: a task that recorded the stack
    it reads, or the workspace lock held around this call and the use."""
    root = paths.private_dir(paths.flats_dir(workspace.pk))
    key = flat_key(oldest_first, markers)
    target = root / key
    if (target / "ids.json").exists():
        return target
    parts, holds = _held_cover(root, oldest_first, markers)
    try:
        unsealed = [part for part in parts
                    if isinstance(part, str) and not Meta.load(paths.layer_dir(part)).sealed and paths.layer_dir(part).is_dir()]
        if unsealed:
            raise RuntimeError(f"a flat holds sealed layers only; not sealed yet: {', '.join(unsealed)}")
        build, held_build = _new_build(root, key)
        try:
            meta = Meta(format=markers, driver="flat", sealed=True)
            writer: Markers = NativeMarkers() if markers == "native" else PortableMarkers(meta)
            (build / "upper").mkdir()
            for part in parts:
                source = part if isinstance(part, Path) else paths.layer_dir(part)
                apply_layer(LayerTree.of_layer(source), build / "upper", writer, share=True)
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
        for held in holds:
            os.close(held)
    return target


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

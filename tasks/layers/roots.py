"""A task's roots (its writable views: the whole view, or one per folder) and its change set.

Below ``task_view`` (which opens, seals and releases views) and ``review`` (Keep's conflict
check), which both read a task's roots and changes from here.
"""
from __future__ import annotations

import os
from pathlib import Path

from tasks.layers import compaction, diff, disk, paths
from tasks.layers.base import get_driver
from tasks.layers.diff import Change, layer_changes
from tasks.layers.driver import Root
from tasks.layers.locks import layer_lock
from tasks.layers.tree import LayerTree, Meta
from tasks.models import Layer, Task


def folder_names(folders: list[str]) -> list[tuple[str, Path]]:
    """Each folder's directory name inside a multi-folder view: its basename, with ``-2``,
    ``-3`` … when two folders share one."""
    named: list[tuple[str, Path]] = []
    used: set[str] = set()
    for folder in folders:
        base = os.path.basename(folder.rstrip("/")) or "root"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        named.append((name, Path(folder)))
    return named


def tree_for(layer_root: Path, meta: Meta, name: str) -> LayerTree:
    """The layer of one root; a multi-folder layer keeps portable markers prefixed by name."""
    if not name:
        return LayerTree(layer_root / "upper", meta)
    prefix = name + "/"
    sub = Meta(format=meta.format, deleted={p[len(prefix):] for p in meta.deleted if p.startswith(prefix)},
               opaque={p[len(prefix):] for p in meta.opaque if p.startswith(prefix)})
    return LayerTree(layer_root / "upper" / name, sub)


def roots_for(task: Task, layer: Layer, *, for_mount: bool, layers: list[LayerTree] | None = None) -> list[Root]:
    """The writable views of ``task``. ``for_mount`` bounds the stack's depth with a flat (the
    flat must then be buildable: its layers sealed); otherwise ``layers`` are the lower layers
    (``compaction.read_trees``), or every layer is listed.

    A task with a disk limit writes into its own image (``tasks.layers.disk``) until its layer
    is settled: its upper, workdir, manifests and the copy driver's working copy are there."""
    ldir, vdir = paths.layer_dir(task.pk), paths.view_dir(task.pk)
    lower_dir = paths.lower_mounts_dir(task.pk)
    own = disk.mounted(task.pk) or ldir  # where the task writes: the overlay upper, the working copy
    upper, manifests = own, own
    if own != ldir and layer.driver == "copy":
        # the working copy is in the image (bound onto the view the task sees); its changes are
        # moved out to the layer on the data filesystem at seal, where a full image cannot stop them
        upper, vdir = ldir, own / "view"
    if task.folders:
        named = folder_names(task.folders)
        if len(named) == 1:
            return [Root("", [LayerTree(named[0][1], plain=True)], upper / "upper", own / "ovl-work",
                         vdir, manifests / "manifest.json", lower_dir / "_", ldir)]
        return [Root(name, [LayerTree(folder, plain=True)], upper / "upper" / name, own / "ovl-work" / name,
                     vdir / name, manifests / f"manifest-{name}.json", lower_dir / name, ldir) for name, folder in named]
    markers = get_driver(layer.driver).markers
    if for_mount:
        lowers = compaction.lower_trees(task.workspace, list(task.layers), markers)
    else:
        lowers = list(layers) if layers is not None else [LayerTree.of_layer(paths.layer_dir(t)) for t in task.layers]
        lowers.append(LayerTree(task.workspace.base_path(), plain=True))
    return [Root("", lowers, upper / "upper", own / "ovl-work", vdir, manifests / "manifest.json", lower_dir / "_", ldir)]


def changes_of(task: Task, layer: Layer, roots: list[Root] | None = None, meta: Meta | None = None) -> list[Change]:
    """The task's change set: live while it runs, from its sealed layer after."""
    roots = roots or roots_for(task, layer, for_mount=False)
    directory = paths.layer_dir(task.pk)
    meta = meta or Meta.load(directory)
    changes: list[Change] = []
    if not meta.sealed:
        # The copy driver's seal moves files out of the working copy before the layer is marked
        # sealed: read under the layer lock, so a reader sees the working copy or the sealed
        # layer, never the half-moved space between them. (Callers that hold the lock pass a
        # sealed ``meta``: flock is not re-entrant.)
        with layer_lock(task.pk):
            meta = Meta.load(directory)
            if not meta.sealed:
                return _live_changes(layer, roots)
    for root in roots:
        changes += layer_changes(tree_for(directory, meta, root.name), root.lower, prefix=root.name)
    return sorted(changes, key=lambda c: c.path)


def _live_changes(layer: Layer, roots: list[Root]) -> list[Change]:
    driver = get_driver(layer.driver)
    changes: list[Change] = []
    for root in roots:
        changes += driver.changes(root)
    return sorted(changes, key=lambda c: c.path)


def diff_body(task: Task, layer: Layer) -> diff.DiffBody:
    """The task's diff as the API shows it. While the layer is not sealed, the change set is
    listed and its files read under the layer lock: a copy-driver seal moves those files."""
    directory = paths.layer_dir(task.pk)
    if not Meta.load(directory).sealed:
        with layer_lock(task.pk):
            if not Meta.load(directory).sealed:
                return diff.render(_live_changes(layer, roots_for(task, layer, for_mount=False)))
    return diff.render(changes_of(task, layer))

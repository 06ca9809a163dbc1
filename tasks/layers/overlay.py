"""The overlay driver: an overlayfs mount per task (root, Linux).

Start cost does not depend on the workspace's size: one ``mount(2)``. The task's changes are
exactly its upper directory (files added or modified, whiteouts for deletions, opaque
directories for replaced ones), so its change set is read from the upper directory alone.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tasks.layers import mounts
from tasks.layers.base import Root
from tasks.layers.diff import Change, layer_changes
from tasks.layers.tree import LayerTree, Meta


class OverlayDriver:
    name = "overlay"
    markers = "native"

    def open(self, root: Root, owner: tuple[int, int] | None = None) -> None:
        if mounts.is_mounted(root.view):
            return
        for directory in (root.upper, root.work, root.view):
            directory.mkdir(parents=True, exist_ok=True)
        lowers = [tree.root for tree in root.lowers]
        if owner is not None:
            lowers = _idmapped(lowers, root.mounts, owner)
            os.chown(root.upper, *owner)  # the task's user creates files at the top of its view
        mounts.mount_overlay(root.view, lowers, root.upper, root.work)

    def changes(self, root: Root) -> list[Change]:
        return layer_changes(LayerTree(root.upper), root.lower, prefix=root.name)

    def seal(self, root: Root, meta: Meta) -> None:
        while mounts.unmount(root.view):
            pass  # a retried mount may have stacked twice on the same point
        mounts.unmount_all_under(root.mounts)
        root.upper.mkdir(parents=True, exist_ok=True)
        # the workdir is overlayfs's scratch space; nothing in it belongs to the layer
        shutil.rmtree(root.work, ignore_errors=True)


def _idmapped(lowers: list[Path], under: Path, owner: tuple[int, int]) -> list[Path]:
    """Each lower layer mounted again, id-mapped so its owner's files appear as the task user's
    (overlayfs itself cannot be id-mapped, its layers can). Unmounted with the view."""
    from tasks.sandbox.idmap import userns_mapping

    namespaces: dict[tuple[int, int], int] = {}
    mapped: list[Path] = []
    try:
        for index, lower in enumerate(lowers):
            st = os.stat(lower)
            key = (st.st_uid, st.st_gid)
            if key not in namespaces:
                namespaces[key] = userns_mapping(owner[0], owner[1], st.st_uid, st.st_gid)
            target = under / str(index)
            if not mounts.is_mounted(target):
                mounts.attach_idmapped(lower, target, namespaces[key])
            mapped.append(target)
    finally:
        for fd in namespaces.values():
            os.close(fd)
    return mapped

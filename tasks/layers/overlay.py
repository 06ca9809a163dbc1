"""The overlay driver: an overlayfs mount per task (root, Linux).

Start cost does not depend on the workspace's size: one ``mount(2)``. The task's changes are
exactly its upper directory (files added or modified, whiteouts for deletions, opaque
directories for replaced ones), so its change set is read from the upper directory alone.
"""
from __future__ import annotations

import shutil

from tasks.layers import mounts
from tasks.layers.base import Root
from tasks.layers.diff import Change, layer_changes
from tasks.layers.tree import LayerTree, Meta


class OverlayDriver:
    name = "overlay"
    markers = "native"

    def open(self, root: Root) -> None:
        if mounts.is_mounted(root.view):
            return
        for directory in (root.upper, root.work, root.view):
            directory.mkdir(parents=True, exist_ok=True)
        mounts.mount_overlay(root.view, [tree.root for tree in root.lowers], root.upper, root.work)

    def changes(self, root: Root) -> list[Change]:
        return layer_changes(LayerTree(root.upper), root.lower, prefix=root.name)

    def seal(self, root: Root, meta: Meta) -> None:
        while mounts.unmount(root.view):
            pass  # a retried mount may have stacked twice on the same point
        root.upper.mkdir(parents=True, exist_ok=True)
        # the workdir is overlayfs's scratch space; nothing in it belongs to the layer
        shutil.rmtree(root.work, ignore_errors=True)

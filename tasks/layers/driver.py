"""The layer driver interface.

A driver gives a task a writable view over read-only lower layers (``open``), tells what the
task changed so far (``changes``), and at the end leaves the task's changes in the layer format
(``seal``). The drivers (``tasks.layers.overlay``, ``tasks.layers.copy``) implement it;
``tasks.layers.base`` picks the one this box uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tasks.layers.diff import Change
from tasks.layers.stack import Stack
from tasks.layers.tree import LayerTree, Meta


@dataclass(frozen=True)
class Root:
    """One writable view of a task: the whole view, or one folder of a multi-folder task."""

    name: str  # '' for the whole view, else the folder's name inside the view
    lowers: list[LayerTree]  # newest first; the base (plain) last
    upper: Path
    work: Path
    view: Path
    manifest: Path  # the copy driver's record of the view as it was copied
    mounts: Path  # where the overlay driver attaches id-mapped lower layers for a sandboxed task
    layer: Path  # the layer's directory (its meta.json, where the copy driver journals a seal)

    @property
    def lower(self) -> Stack:
        return Stack(self.lowers)


class Driver(Protocol):
    name: str
    markers: str  # the marker spelling of layers it writes: native | portable

    def open(self, root: Root, owner: tuple[int, int] | None = None) -> None:
        """Make ``root.view`` show the lowers with writes going to the task's layer. Idempotent:
        an open view is left as it is, so a retried run sees its earlier writes. ``owner``: the
        sandbox user (uid, gid) the view is made for, when the task runs sandboxed."""

    def changes(self, root: Root) -> list[Change]:
        """The change set so far (the task may still be writing)."""

    def seal(self, root: Root, meta: Meta) -> None:
        """Stop the view and leave the changes in ``root.upper`` in the layer format. Idempotent."""

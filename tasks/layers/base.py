"""The layer driver interface, and which driver this box uses.

A driver gives a task a writable view over read-only lower layers (``open``), tells what the
task changed so far (``changes``), and at the end leaves the task's changes in the layer format
(``seal``). ``overlay`` needs root and a kernel that allows overlayfs on the data directory;
``copy`` works anywhere. ``BOX_LAYER_DRIVER`` = auto (overlay when the probe passes) | overlay |
copy.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tasks.layers.diff import Change
from tasks.layers.stack import Stack
from tasks.layers.tree import LayerTree, Meta

log = logging.getLogger(__name__)

DRIVERS = ("auto", "overlay", "copy")


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


_probe_lock = threading.Lock()
_probe: dict[str, str | None] = {}


def overlay_refusal() -> str | None:
    """Why overlayfs cannot be used here (None: it can). Probed once per process and data dir:
    a real mount with a whiteout, on the filesystem layers will live on."""
    key = str(settings.BOX_DATA_DIR)
    with _probe_lock:
        if key not in _probe:
            _probe[key] = _run_probe(Path(key))
        return _probe[key]


def _run_probe(data: Path) -> str | None:
    if os.geteuid() != 0:
        return "the box is not running as root"
    from tasks.layers import mounts

    base = data / "layers" / f".probe-{os.getpid()}-{threading.get_ident()}"
    try:
        for part in ("lower", "upper", "work", "view"):
            (base / part).mkdir(parents=True, exist_ok=True)
        (base / "lower" / "f").write_text("x")
        mounts.mount_overlay(base / "view", [base / "lower"], base / "upper", base / "work")
        try:
            (base / "view" / "f").unlink()
            (base / "view" / "g").write_text("y")
        finally:
            mounts.unmount(base / "view")
        from tasks.layers.tree import LayerTree as _Tree, WHITEOUT

        entry = _Tree(base / "upper").entry("f")
        if entry is None or entry.kind != WHITEOUT:
            return "the kernel's overlayfs did not leave a whiteout for a deletion"
        return None
    except OSError as exc:
        return f"overlayfs is not available on {data}: {exc}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def driver_name() -> str:
    """The driver new tasks get."""
    choice = (settings.BOX_LAYER_DRIVER or "auto").strip().lower()
    if choice not in DRIVERS:
        raise ImproperlyConfigured(f"BOX_LAYER_DRIVER={choice!r}: use one of {', '.join(DRIVERS)}")
    if choice == "copy":
        return "copy"
    refusal = overlay_refusal()
    if refusal is None:
        return "overlay"
    if choice == "overlay":
        raise ImproperlyConfigured(f"BOX_LAYER_DRIVER=overlay but {refusal}")
    return "copy"


def get_driver(name: str) -> Driver:
    if name == "overlay":
        from tasks.layers.overlay import OverlayDriver

        return OverlayDriver()
    from tasks.layers.copy import CopyDriver

    return CopyDriver()

"""Which layer driver this box uses (the interface is ``tasks.layers.driver``).

``overlay`` needs root and a kernel that allows overlayfs on the data directory;
``copy`` works anywhere. ``BOX_LAYER_DRIVER`` = auto (overlay when the probe passes) | overlay |
copy.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tasks.layers import mounts, paths
from tasks.layers.copy import CopyDriver
from tasks.layers.driver import Driver
from tasks.layers.overlay import OverlayDriver
from tasks.layers.tree import WHITEOUT, LayerTree

log = logging.getLogger(__name__)

DRIVERS = ("auto", "overlay", "copy")


def overlay_refusal() -> str | None:
    """Why overlayfs cannot be used here (None: it can). Probed once per process and data dir:
    a real mount with a whiteout, on the filesystem layers will live on."""
    return paths.probed("overlay", _run_probe)


def _run_probe(data: Path) -> str | None:
    if os.geteuid() != 0:
        return "the box is not running as root"

    base = paths.probe_dir(data, "probe")
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

        entry = LayerTree(base / "upper").entry("f")
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
        return OverlayDriver()
    return CopyDriver()

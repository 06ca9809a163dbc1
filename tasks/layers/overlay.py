"""The overlay driver: an overlayfs mount per task (root, Linux).

Start cost does not depend on the workspace's size: one ``mount(2)``. The task's changes are
exactly its upper directory (files added or modified, whiteouts for deletions, opaque
directories for replaced ones), so its change set is read from the upper directory alone. At
seal, opaque directories are rewritten as whiteouts for what they hid and copy-ups whose content
equals the file they copied are dropped, so a layer holds exactly the paths the task changed.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from tasks.layers import mounts, paths
from tasks.layers.diff import Change, layer_changes
from tasks.layers.driver import Root
from tasks.layers.paths import join
from tasks.layers.stack import DIR, Stack, same_content
from tasks.layers.tree import (
    OPAQUE_XATTR,
    WHITEOUT,
    LayerTree,
    Meta,
    NativeMarkers,
    has_opaque_xattr,
    mark_may_hold_whiteouts,
)
from tasks.sandbox.idmap import userns_mapping


def adopt(upper: Path, owner: tuple[int, int]) -> None:
    """Give the upper directory, and everything the task made in it, to ``owner``.

    When a task's sandbox is released (its task ended, or the box stopped while it was active),
    its files are handed to root so a recycled uid cannot reach them, and its user is removed.
    The task's next run makes the user again (often with another uid): unless the files the task
    made before are given back, its next step cannot change them ("cannot create ...:
    Permission denied"). The upper directory holds only the task's own changes; symlinks are
    never followed, other file systems never entered. A walk only when the upper directory is
    not already the owner's (right after such a release), so a plain open costs one stat."""
    uid, gid = owner
    if upper.stat().st_uid != uid:
        device = upper.stat().st_dev
        for directory, dirnames, filenames in os.walk(upper):
            kept = []
            for name in dirnames:
                path = os.path.join(directory, name)
                stat = os.lstat(path)
                if stat.st_dev == device:
                    kept.append(name)
                    os.lchown(path, uid, gid)
            dirnames[:] = kept
            for name in filenames:
                os.lchown(os.path.join(directory, name), uid, gid)
    os.chown(upper, uid, gid)


class OverlayDriver:
    name = "overlay"
    markers = "native"

    def open(self, root: Root, owner: tuple[int, int] | None = None) -> None:
        if mounts.is_mounted(root.view):
            return
        for directory in (root.upper, root.work, root.view):
            directory.mkdir(parents=True, exist_ok=True)
        lowers = [tree.root for tree in root.lowers]
        if owner is None:
            mounts.mount_overlay(root.view, lowers, root.upper, root.work)
            return
        adopt(root.upper, owner)  # the task's user creates files at the top of its view
        _mount_idmapped(root, lowers, owner)

    def changes(self, root: Root) -> list[Change]:
        return layer_changes(LayerTree(root.upper), root.lower, prefix=root.name)

    def seal(self, root: Root, meta: Meta) -> None:
        while mounts.unmount(root.view):
            pass  # a retried mount may have stacked twice on the same point
        mounts.unmount_all_under(root.mounts)
        root.upper.mkdir(parents=True, exist_ok=True)
        # the workdir is overlayfs's scratch space; nothing in it belongs to the layer
        shutil.rmtree(root.work, ignore_errors=True)
        clear_opaque_dirs(root.upper, root.lower)
        drop_unchanged_copies(LayerTree(root.upper), root.lower)


def clear_opaque_dirs(upper: Path, lower: Stack) -> None:
    """Rewrite each opaque directory (``rm -rf d && mkdir d``) as a plain one plus a whiteout
    for every entry it hid. A layer then says exactly which paths the task changed, so undoing
    a task beneath it reveals what that task hid, as on the copy driver (which sees only
    entries, not how a directory was made)."""
    tree = LayerTree(upper)

    def plain(rel: str) -> None:
        ours = tree.children(rel)
        for name, below in lower.listdir(rel).items():
            child = join(rel, name)
            entry = ours.get(name)
            if entry is None:
                NativeMarkers().whiteout(upper, child)
            elif entry.kind == DIR and below.kind == DIR:
                plain(child)  # a directory made anew inside: it hid the old one's entries too
        if rel and has_opaque_xattr(upper / rel):
            os.removexattr(upper / rel, OPAQUE_XATTR, follow_symlinks=False)

    for rel, entry in list(tree.walk()):
        if entry.kind == DIR and entry.opaque:
            plain(rel)


def drop_unchanged_copies(tree: LayerTree, lower: Stack) -> None:
    """Remove the copy-ups that equal what they copied (``touch``, ``sed -i`` that matched
    nothing, the same bytes written again), and the directories overlayfs copied up only to hold
    them: they are not changes, and left in the layer they would keep old content alive when a
    task beneath is undone. The copy driver's layer never holds them in the first place. Each
    directory left holding a whiteout is marked so overlayfs hides it (``mark_may_hold_whiteouts``)."""

    def visit(rel: str) -> bool:
        """True when ``rel`` holds nothing of the task's any more."""
        empty = True
        for name, entry in sorted(tree.children(rel).items()):
            inner = join(rel, name)
            below = lower.lookup(inner)
            if entry.kind == WHITEOUT:
                mark_may_hold_whiteouts(tree.path(rel))
            elif entry.kind == DIR:
                if visit(inner) and not entry.opaque and below is not None and below.kind == DIR:
                    os.rmdir(tree.path(inner))
                    continue
            elif below is not None and below.kind == entry.kind and below.path is not None \
                    and same_content(tree.path(inner), below.path):
                os.unlink(tree.path(inner))
                continue
            empty = False
        return empty

    visit("")


def layers_by_fd_refusal() -> str | None:
    """Why this kernel takes no detached mount as an overlay's lower layer, given by descriptor
    (``mounts.mount_overlay_layers``, Linux 6.15; None: it does). Probed once per process and
    data directory, for real."""
    return paths.probed("overlay-fd", _probe_layers_by_fd)


def _probe_layers_by_fd(data: Path) -> str | None:
    base = paths.probe_dir(data, "layerfd")
    try:
        for part in ("lower", "upper", "work", "view"):
            (base / part).mkdir(parents=True, exist_ok=True)
        (base / "lower" / "f").write_text("x")
        lower = mounts.clone_idmapped(base / "lower")
        try:
            mounts.mount_overlay_layers(base / "view", [lower], base / "upper", base / "work")
        finally:
            os.close(lower)
        try:
            if (base / "view" / "f").read_text() != "x":
                return "an overlay over a detached lower layer did not show it"
        finally:
            mounts.unmount(base / "view")
        return None
    except OSError as exc:
        return f"the kernel takes no detached overlay layer by descriptor: {exc}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _mount_idmapped(root: Root, lowers: list[Path], owner: tuple[int, int]) -> None:
    """Mount ``root``'s view over ``lowers`` as the task's user sees them: their owner's files
    shown as the user's (overlayfs itself cannot be id-mapped, its layers can).

    Each directory of the data directory that holds lower layers (``layers``, ``flats``,
    ``workspaces``) is copied once, detached, id-mapped (root's files shown as the user's) and
    read-only, without what is mounted below it (other tasks' views and images); each lower
    layer is a detached copy of its directory in that copy, given to overlayfs by descriptor.
    Nothing but the view is mounted on the host, and the view's mount options name no layer
    (each shows as ``/``). A kernel that takes no layer so (``layers_by_fd_refusal``) gets the
    same copies mounted under ``root.mounts`` instead (``_attached``)."""
    if layers_by_fd_refusal() is not None:
        mounts.mount_overlay(root.view, _attached(lowers, root.mounts, owner), root.upper, root.work)
        return
    opened: list[int] = []
    try:
        layers: list[int] = []
        areas: dict[str, int] = {}
        for lower, userns, area_name, rest in _placed(lowers, owner, set()):
            opened.append(userns)
            if area_name and area_name not in areas:
                areas[area_name] = mounts.clone_idmapped(paths.data_dir() / area_name, userns_fd=userns)
                opened.append(areas[area_name])
            if area_name:
                layers.append(mounts.clone_idmapped(rest, at=areas[area_name]))
            else:
                layers.append(mounts.clone_idmapped(lower, userns_fd=userns))
            opened.append(layers[-1])
        mounts.mount_overlay_layers(root.view, layers, root.upper, root.work)
    finally:
        for fd in opened:
            os.close(fd)


def _placed(lowers: list[Path], owner: tuple[int, int], attached: set[str]) -> Iterator[tuple[Path, int, str, str]]:
    """Each lower layer with the user namespace that maps its owner's ids to ``owner`` (a file
    descriptor: the caller closes it), and where it is id-mapped from: the directory of the data
    directory it is in and its path inside it, or ``""`` twice when it is mapped on its own (one
    another user owns, one outside the data directory, or one below another mount). ``attached``:
    mount points of this view's own (``_attached``), which hide nothing."""
    # Paths as strings: a start handles every lower this way (up to the compaction depth), and
    # pathlib's parsing of each joined or compared path would cost more than the work itself.
    data = paths.data_dir()
    data_prefix = f"{data}/"
    table = mounts.mounts_under(data)  # one reading of the mount table for every layer
    below = tuple(f"{point}/" for point in table if point != data and str(point) not in attached)
    namespaces: dict[tuple[int, int], int] = {}
    try:
        for lower in lowers:
            name = str(lower)
            st = os.stat(name)
            key = (st.st_uid, st.st_gid)
            if key not in namespaces:
                namespaces[key] = userns_mapping(owner[0], owner[1], st.st_uid, st.st_gid)
            area_name, _, rest = name[len(data_prefix):].partition("/") if name.startswith(data_prefix) and key == (0, 0) else ("", "", "")
            if not rest or f"{name}/".startswith(below):
                area_name = rest = ""
            yield lower, os.dup(namespaces[key]), area_name, rest
    finally:
        for fd in namespaces.values():
            os.close(fd)


def _attached(lowers: list[Path], under: Path, owner: tuple[int, int]) -> list[Path]:
    """``_mount_idmapped`` on a kernel before 6.15: the id-mapped copies are mounted under
    ``under`` (root's alone, 0700: the sandbox never sees them, its root holds the view alone),
    each area once, and each lower layer is given to overlayfs as a symbolic link into its area's
    mount, so the view's mount options name ``under/<n>``, no layer's task. The box makes every
    directory on the way as root: a path through such a mount is walked on root's ids.
    Unmounted with the view."""
    under_name = str(under)
    attached = {str(point) for point in mounts.mounts_under(under)}
    if not attached:
        for directory in (under.parent, under):
            _private(directory)
    mapped: list[Path] = []
    for index, (lower, userns, area_name, rest) in enumerate(_placed(lowers, owner, attached)):
        try:
            target = f"{under_name}/{index}"
            if area_name:
                area = f"{under_name}/{area_name}"
                if area not in attached:
                    mounts.attach_idmapped(paths.data_dir() / area_name, Path(area), userns)
                    attached.add(area)
                _link(target, f"{area}/{rest}")
            elif target not in attached:
                mounts.attach_idmapped(lower, Path(target), userns)
            mapped.append(Path(target))
        finally:
            os.close(userns)
    return mapped


def _link(link: str, target: str) -> None:
    try:
        os.symlink(target, link)
    except FileExistsError:
        if os.path.islink(link) and os.readlink(link) == target:
            return
        (os.unlink if os.path.islink(link) else os.rmdir)(link)  # left by an earlier opening
        os.symlink(target, link)


def _private(directory: Path) -> None:
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        os.chmod(directory, 0o700)
    except FileNotFoundError:
        directory.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(directory, 0o700)

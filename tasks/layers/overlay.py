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
        if owner is not None:
            lowers = _idmapped(lowers, root.mounts, owner)
            adopt(root.upper, owner)  # the task's user creates files at the top of its view
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


def _idmapped(lowers: list[Path], under: Path, owner: tuple[int, int]) -> list[Path]:
    """The lower layers as the task's user sees them: its owner's files shown as the user's
    (overlayfs itself cannot be id-mapped, its layers can). Unmounted with the view.

    Each directory of the data directory that holds lower layers (``layers``, ``flats``,
    ``workspaces``) is mounted once per task, id-mapped (root's files shown as the user's) and
    read-only, without what is mounted below it (other tasks' views and images); each lower
    layer in it is given to overlayfs as a symbolic link into that mount, so the view's mount
    options name ``under/<n>``, no layer's task. The box makes every directory on the way as
    root: a path through such a mount is walked on root's ids. A lower layer another user owns,
    one outside the data directory, or one below another mount is mounted again on its own. ``under`` is root's alone (0700): these mounts show root's files as the
    task user's. The sandbox never sees any of them: its root holds the view alone
    (``tasks.sandbox.init``)."""
    # Paths as strings: a start handles every lower this way (up to the compaction depth), and
    # pathlib's parsing of each joined or compared path was most of this function's CPU.
    data = paths.data_dir()
    data_prefix, under_name = f"{data}/", str(under)
    table = mounts.mounts_under(under, data)  # one reading of the mount table for every layer
    attached = {str(point) for point in table if point == under or under in point.parents}
    below = tuple(f"{point}/" for point in table if point != data and str(point) not in attached)
    if not attached:
        for directory in (under.parent, under):
            _private(directory)
    namespaces: dict[tuple[int, int], int] = {}
    mapped: list[Path] = []
    try:
        for index, lower in enumerate(lowers):
            name = str(lower)
            st = os.stat(name)
            key = (st.st_uid, st.st_gid)
            if key not in namespaces:
                namespaces[key] = userns_mapping(owner[0], owner[1], st.st_uid, st.st_gid)
            target = f"{under_name}/{index}"
            # the lower's directory of the data directory, and its path inside it (root's layers only)
            area_name, _, rest = name[len(data_prefix):].partition("/") if name.startswith(data_prefix) and key == (0, 0) else ("", "", "")
            if rest and not f"{name}/".startswith(below):
                area = f"{under_name}/{area_name}"
                if area not in attached:
                    mounts.attach_idmapped(data / area_name, Path(area), namespaces[key])
                    attached.add(area)
                _link(target, f"{area}/{rest}")
            elif target not in attached:
                mounts.attach_idmapped(lower, Path(target), namespaces[key])
            mapped.append(Path(target))
    finally:
        for fd in namespaces.values():
            os.close(fd)
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

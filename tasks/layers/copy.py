"""The copy driver: no privileges, any OS with a POSIX filesystem.

At start the task's view is materialised into its own directory (the base copied with
``cp -a``, then each lower layer laid over it) and a manifest of what was copied is kept
(kind, size, mtime, mode, inode and ctime per path). At the end the working copy is compared
with the manifest: an entry whose inode and ctime are unchanged is provably untouched; any other
file is compared by content with what was copied, and only a real change is moved into the
task's layer (as overlayfs's copy-up of an unchanged file is dropped at seal). Deletions are
written as portable whiteouts, so a finished copy layer has the same format and meaning as an
overlay one: exactly the paths the task changed.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tasks.layers import paths
from tasks.layers.diff import ADDED, DELETED, MODIFIED, Change
from tasks.layers.driver import Root
from tasks.layers.paths import join, parent_of
from tasks.layers.stack import DIR, View, same_content, walk_files
from tasks.layers.tree import LayerTree, Meta, apply_layer, copy_entry, remove_path, write_atomically

log = logging.getLogger(__name__)

Snapshot = dict[str, list[int | str]]  # rel -> [kind d/f/l/s, size, mtime_ns, mode, inode, ctime_ns]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "d"
    if stat.S_ISLNK(mode):
        return "l"
    if stat.S_ISREG(mode):
        return "f"
    return "s"  # FIFO, socket, device: moved and listed, never opened


def stat_entry(st: os.stat_result) -> list[int | str]:
    return [_kind(st.st_mode), st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), st.st_ino, st.st_ctime_ns]


def unchanged(before: list[int | str], st: os.stat_result) -> bool:
    """The entry is provably the one recorded: same inode, and no change to it since (ctime moves
    on every write, rename, link or chmod, and no one can set it back). Size and mtime alone
    prove nothing: a file renamed over another of the same size and mtime keeps both."""
    return len(before) == 6 and before == stat_entry(st)


def snapshot(root: Path) -> Snapshot:
    found: Snapshot = {}

    def visit(directory: Path, rel: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                path = join(rel, entry.name)
                found[path] = stat_entry(st)
                if stat.S_ISDIR(st.st_mode):
                    visit(Path(entry.path), path)

    visit(root, "")
    return found


def copy_tree(source: Path, target: Path, *, keep_links: bool = True) -> None:
    """``target`` becomes a copy of ``source`` (``cp -a`` where there is one: it is C-fast).
    ``keep_links=False`` gives hard-linked files separate copies, as an overlay copy-up would."""
    target.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        return
    cp = shutil.which("cp")
    if cp:
        extra = [] if keep_links else ["--no-preserve=links"]
        subprocess.run([cp, "-a", *extra, f"{source}/.", str(target)], check=True, capture_output=True)
    else:
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True, copy_function=_copy_file)


def _copy_file(source: str, target: str) -> None:
    copy_entry(Path(source), Path(target))


def materialise(lowers: list[LayerTree], target: Path) -> None:
    copy_tree(lowers[-1].root, target, keep_links=False)
    for tree in reversed(lowers[:-1]):  # oldest layer first, newest last
        if tree.entry("") is not None:
            apply_layer(tree, target, None, share=False)


@dataclass
class Scan:
    files: dict[str, Change] = field(default_factory=dict)  # added/modified, ``new`` in the view
    carry: list[str] = field(default_factory=list)  # the files the layer takes (the changed ones)
    new_dirs: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # gone entirely, collapsed to the top path
    replaced: list[str] = field(default_factory=list)  # now another kind (a file where a dir was)
    present: dict[str, str] = field(default_factory=dict)


def scan(view: Path, manifest: Snapshot, lower: View, prefix: str) -> Scan:
    """Compare the working copy with the manifest of what was copied. ``lower`` is this root's
    own stack (paths without ``prefix``); changes are reported with ``prefix``."""
    result = Scan()
    present = result.present

    def visit(directory: Path, rel: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                path = join(rel, entry.name)
                kind = _kind(st.st_mode)
                present[path] = kind
                before = manifest.get(path)
                if before is not None and before[0] != kind:
                    result.replaced.append(path)
                if kind == "d":
                    if before is None or before[0] != "d":
                        result.new_dirs.append(path)
                    visit(Path(entry.path), path)
                    continue
                if before is not None and before[0] == kind and unchanged(before, st):
                    continue
                full = join(prefix, path) if prefix else path
                below = lower.lookup(path)
                new = Path(entry.path)
                if below is None or below.kind == DIR or below.path is None:
                    result.files[path] = Change(full, ADDED, new=new)
                elif not same_content(new, below.path):
                    result.files[path] = Change(full, MODIFIED, new=new, old=below.path)
                else:
                    continue  # touched (or removed and made again) with the same content: not a change
                result.carry.append(path)

    if view.is_dir():
        visit(view, "")
    cut = {p for p, k in present.items() if k != "d"}

    def under_cut(rel: str) -> bool:
        parent = parent_of(rel)
        while parent:
            if parent in cut:
                return True
            parent = parent_of(parent)
        return False

    gone = sorted(p for p in manifest if p not in present and not under_cut(p))
    gone_set = set(gone)
    result.deleted = [p for p in gone if parent_of(p) not in gone_set]
    return result


def _deleted_changes(result: Scan, lower: View, prefix: str) -> list[Change]:
    changes: list[Change] = []
    for rel in result.deleted + result.replaced:
        for path, found in walk_files(lower, rel):
            if path in result.files or result.present.get(path, "d") != "d":
                continue  # still a file (changed or not), or replaced by one
            full = join(prefix, path) if prefix else path
            changes.append(Change(full, DELETED, old=found.path))
    return changes


class CopyDriver:
    name = "copy"
    markers = "portable"

    def open(self, root: Root, owner: tuple[int, int] | None = None) -> None:
        # ``owner`` is not needed: the sandbox id-maps a plain directory view itself
        if root.view.is_dir():
            return  # complete: a view only appears by the rename below
        tmp = root.view.with_name(f".{root.view.name}.copying")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        materialise(root.lowers, tmp)
        write_atomically(root.manifest, json.dumps(snapshot(tmp)).encode())
        root.upper.mkdir(parents=True, exist_ok=True)
        tmp.rename(root.view)

    def _manifest(self, root: Root) -> Snapshot:
        try:
            loaded: Snapshot = json.loads(root.manifest.read_text())
            return loaded
        except FileNotFoundError:
            return {}

    def changes(self, root: Root) -> list[Change]:
        if not root.view.is_dir():
            return []
        result = scan(root.view, self._manifest(root), root.lower, root.name)
        changes = list(result.files.values()) + _deleted_changes(result, root.lower, root.name)
        return sorted(changes, key=lambda c: c.path)

    def seal(self, root: Root, meta: Meta) -> None:
        """The scan's result is journaled in the layer's meta before the first move, and a seal
        that finds it finishes it without scanning again: once a file is moved out, the working
        copy alone no longer tells what the task changed (a moved file looks deleted, and a
        deletion, once the working copy is gone, is nowhere). The save that seals the layer
        ends the journal (``Meta.sealing``)."""
        root.upper.mkdir(parents=True, exist_ok=True)
        journal = meta.sealing.get(root.name)
        resuming = journal is not None
        if journal is None:
            if not root.view.is_dir():
                return
            result = scan(root.view, self._manifest(root), root.lower, root.name)
            gone = [rel for rel in result.deleted if not os.path.lexists(root.view / rel)]
            journal = meta.sealing[root.name] = {"dirs": result.new_dirs, "moves": result.carry, "deleted": gone}
            meta.save(root.layer, sync_dir=True)
        markers_prefix = f"{root.name}/" if root.name else ""

        made: set[str] = set()

        def make_dir(rel: str) -> None:
            if rel in made:
                return
            made.add(rel)
            target = root.upper / rel
            if target.is_dir() and not resuming:
                return
            if not target.is_dir():
                target.mkdir()
            if os.path.lexists(root.view / rel):
                # again when resuming: a crash may have come between a mkdir and its copystat
                shutil.copystat(root.view / rel, target, follow_symlinks=False)

        def make_parents(rel: str) -> None:
            parent = parent_of(rel)
            if not parent or parent in made or ((root.upper / parent).is_dir() and not resuming):
                return
            make_parents(parent)
            make_dir(parent)

        for rel in journal["dirs"]:
            make_parents(rel)
            make_dir(rel)
        for rel in journal["moves"]:
            if not os.path.lexists(root.view / rel):
                if not os.path.lexists(root.upper / rel):
                    # Gone from the working copy before it was carried: a process that outlived
                    # the task (no sandbox to stop it) deleted it, or a power cut lost it before
                    # the image's data reached the disk. Carried as nothing: one lost file must
                    # not keep the layer, and every later start in the workspace, unsealed.
                    log.warning("%s vanished from the working copy before the seal carried it", rel)
                continue  # else moved by the seal a crash cut short
            make_parents(rel)
            _move(root.view / rel, root.upper / rel)
        for rel in journal["deleted"]:
            make_parents(rel)  # a portable whiteout's directory exists in the layer, as overlayfs makes it
            meta.deleted.add(markers_prefix + rel)
        if root.view.is_dir():
            discard(root.view)
        root.manifest.unlink(missing_ok=True)


def _move(source: Path, target: Path) -> None:
    """A rename on one filesystem; a copy (owner, mode and times kept) from a working copy in
    the task's own disk image (``tasks.layers.disk``) to its layer on the data filesystem."""
    try:
        os.replace(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    st = os.lstat(source)
    remove_path(target)  # a copy a crash cut short
    copy_entry(source, target)
    os.lchown(target, st.st_uid, st.st_gid)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(target, stat.S_IMODE(st.st_mode))  # chown cleared set-id bits
    os.unlink(source)


def discard(directory: Path) -> None:
    """Delete a working copy without making the task's end wait for it: a rename into the
    trash, then removal in the background (start-up reconcile empties what a crash left)."""

    trash = paths.trash_dir() / f"{directory.parent.name}-{directory.name}-{os.getpid()}-{threading.get_ident()}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(directory, trash)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # a working copy in the task's own disk image (tasks.layers.disk): set aside there; the
        # image is deleted whole once the layer is settled
        os.rename(directory, directory.with_name(f".discarded-{directory.name}"))
        return
    threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True},
                     name="layers-trash", daemon=True).start()


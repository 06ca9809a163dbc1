"""Folder tasks: Keep or Undo, with conflict detection.

A folder task works on a layer over the owner's real folder; nothing touches the folder until
Keep. To know whether the owner changed a path the task also changed, the box keeps:

- at start, a manifest of the folder (kind, size, mtime, mode, inode, ctime per path: a stat
  walk, no reads);
- at the end, for each path the task touched that is provably unchanged since start (same inode
  and ctime: ctime moves on every write, rename or chmod), its fingerprint (SHA-256 and mode).

Keep applies the change set only when every touched path still has its start stat and
fingerprint (or already holds the task's version: a Keep interrupted by a crash is completed by
the next one). A directory the task replaced by a file only has to still be a directory (its old
entries are checked one by one). Otherwise ``review=conflict``, nothing is applied, and each
conflicting path is reported with why. The folder then ends as the task's view: files and links
replaced atomically (written beside the target, fsynced, renamed over it), deletions applied,
directories the task made (even empty) made, directories it removed removed.

Nothing on the way is followed: every path is reached from the folder's directory descriptor
with ``O_NOFOLLOW`` (``nofollow``), so a link where a directory was is a conflict, never a way
out of the folder. Special files (FIFO, socket, device) are never kept, opened or replaced: a
task's special file, or one in the owner's folder where the task wrote, is a conflict.

This module is the files' side of Keep; the review moves themselves are task actions
(``tasks.verbs.keep_review``).
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tasks.layers import nofollow, paths
from tasks.layers.copy import snapshot, stat_entry
from tasks.layers.diff import DELETED, Change, special_of
from tasks.layers.driver import Root
from tasks.layers.paths import show
from tasks.layers.roots import changes_of, folder_names, roots_for, tree_for
from tasks.layers.stack import DIR, Stack
from tasks.layers.tree import WHITEOUT, Meta, write_atomically
from tasks.models import Layer, Task


def _start_file(task_id: str) -> Path:
    return paths.layer_dir(task_id) / "folder-start.json"


def _touched_file(task_id: str) -> Path:
    return paths.layer_dir(task_id) / "folder-touched.json"


def record_start(task: Task, roots: list[Root]) -> None:
    """At the first start only (a retry keeps the first record)."""
    target = _start_file(task.pk)
    if target.exists():
        return
    body = {root.name: snapshot(root.lowers[-1].root) for root in roots}
    write_atomically(target, json.dumps(body).encode())


def _split(task: Task, path: str) -> tuple[str, str]:
    """(root name, path inside that folder) for a path of the task's view."""
    if len(task.folders) == 1:
        return "", path
    name, _, rest = path.partition("/")
    return name, rest


def locate(task: Task, path: str) -> tuple[Path, str]:
    """(the real folder, the path inside it) for a path of the task's view. Everything below the
    folder is reached without following links (``nofollow``)."""
    name, rest = _split(task, path)
    folders = dict(folder_names(task.folders))
    return (Path(task.folders[0]) if not name else folders[name]), rest


def _stat_entry(folder: Path, rel: str) -> list[Any] | None:
    st = nofollow.lstat_at(folder, rel)
    return None if st is None else stat_entry(st)


def record_touched(task: Task, roots: list[Root]) -> None:
    """When the task's layer is sealed: for every path it touched that is provably unchanged
    since the start (same inode, same ctime), its fingerprint (content hash) now."""
    try:
        start: dict[str, dict[str, list[Any]]] = json.loads(_start_file(task.pk).read_text())
    except FileNotFoundError:
        start = {}
    layer = Layer.objects.get(task=task)
    touched: dict[str, dict[str, Any]] = {}
    for change in changes_of(task, layer, roots):
        name, rest = _split(task, change.path)
        before = start.get(name, {}).get(rest)
        folder, rel = locate(task, change.path)
        try:
            now = _stat_entry(folder, rel)
            same = before is not None and now is not None and now == before and now[0] != "d"
            fingerprint = nofollow.fingerprint(folder, rel) if same else None
        except nofollow.LinkInPath:
            fingerprint = None
        touched[change.path] = {"start": before, "hash": fingerprint}
    write_atomically(_touched_file(task.pk), json.dumps(touched).encode())


def _already_ours(change: Change, folder: Path, rel: str) -> bool:
    if change.kind == DELETED:
        return nofollow.lstat_at(folder, rel) is None
    if change.new is None or special_of(change.new):
        return False
    return nofollow.fingerprint(folder, rel) == nofollow.fingerprint_path(change.new)


def _conflict(change: Change, folder: Path, rel: str, record: dict[str, Any]) -> str | None:
    """Why this change cannot be applied (None: it can)."""
    kind = special_of(change.new)
    if kind:
        return f"{show(change.path)} is a {kind} the task made: special files are never kept"
    try:
        if _already_ours(change, folder, rel):
            return None
        now = _stat_entry(folder, rel)
    except nofollow.LinkInPath:
        return f"{show(change.path)}: a folder on the way is now a link or a file; links are never followed"
    if now is not None and now[0] == "s":
        return f"{show(change.path)} is a special file in your folder: it is never opened or replaced"
    start = record.get("start")
    if start is None:
        return None if now is None else f"you created {show(change.path)} since the task started"
    if start[0] == "d":  # a directory the task replaced: its old entries are checked one by one
        return None if now is not None and now[0] == "d" else f"you changed {show(change.path)} since the task started"
    if now is None or now != start or record.get("hash") is None or nofollow.fingerprint(folder, rel) != record["hash"]:
        return f"you changed {show(change.path)} since the task started"
    return None


def find_conflicts(task: Task, changes: list[Change], dirs: list[tuple[Path, str, str]] | None = None) -> dict[str, str]:
    """Path -> why it cannot be kept, for every change (and directory move) that cannot."""
    try:
        touched: dict[str, dict[str, Any]] = json.loads(_touched_file(task.pk).read_text())
    except FileNotFoundError:
        touched = {}
    conflicts: dict[str, str] = {}
    deleted = {locate(task, c.path) for c in changes if c.kind == DELETED}
    for change in changes:
        folder, rel = locate(task, change.path)
        reason = _conflict(change, folder, rel, touched.get(change.path, {}))
        if reason:
            conflicts[change.path] = reason
    for folder, rel, shown_path in dirs or []:
        try:
            now = nofollow.lstat_at(folder, rel)
        except nofollow.LinkInPath:
            conflicts[shown_path] = f"{show(shown_path)}: a folder on the way is now a link or a file"
            continue
        if now is not None and not stat.S_ISDIR(now.st_mode) and (folder, rel) not in deleted:
            conflicts[shown_path] = f"the task made the folder {show(shown_path)}, and you put a file there"
    return conflicts


def _task_views(task: Task) -> dict[str, Stack]:
    """Each folder as the task left it (its layer over the folder), to tell which directories
    it deleted."""
    layer = Layer.objects.get(task=task)
    meta = Meta.load(paths.layer_dir(task.pk))
    return {root.name: Stack([tree_for(paths.layer_dir(task.pk), meta, root.name), *root.lowers])
            for root in roots_for(task, layer, for_mount=False)}


def directory_moves(task: Task) -> tuple[list[tuple[Path, str, str]], list[tuple[Path, str]]]:
    """The directories the task's layer makes (parents first) and the ones it removes, even
    empty ones: a folder ends as the task's view, not only its files."""
    meta = Meta.load(paths.layer_dir(task.pk))
    named = folder_names(task.folders)
    roots = [("", Path(task.folders[0]))] if len(named) == 1 else named
    make: list[tuple[Path, str, str]] = []
    remove: list[tuple[Path, str]] = []
    for name, folder in roots:
        tree = tree_for(paths.layer_dir(task.pk), meta, name)
        for rel, entry in tree.walk():
            if entry.kind == DIR:
                make.append((folder, rel, paths.join(name, rel) if name else rel))
                if entry.opaque:
                    ours = tree.children(rel)
                    remove += [(folder, paths.join(rel, child)) for child in _real_dirs(folder, rel) if child not in ours]
            elif entry.kind == WHITEOUT:
                remove.append((folder, rel))
    return make, remove


def _real_dirs(folder: Path, rel: str) -> list[str]:
    try:
        with nofollow.directory(folder, rel) as fd:
            return [e.name for e in os.scandir(fd) if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, nofollow.LinkInPath):
        return []


def apply_changes(task: Task, changes: list[Change], make: list[tuple[Path, str, str]],
           remove: list[tuple[Path, str]]) -> None:
    views = _task_views(task)
    deletions = [c for c in changes if c.kind == DELETED]
    for change in sorted(deletions, key=lambda c: c.path.count("/"), reverse=True):
        folder, rel = locate(task, change.path)
        nofollow.remove_at(folder, rel)
        _prune_parents(task, change.path, views)
    for folder, rel in remove:
        nofollow.remove_empty_tree_at(folder, rel)
    layer_root = paths.layer_dir(task.pk) / "upper"
    for folder, rel, shown_path in make:
        source = layer_root / shown_path
        nofollow.make_dir_at(folder, rel, like=os.lstat(source))
    for change in changes:
        if change.kind != DELETED and change.new is not None:
            folder, rel = locate(task, change.path)
            nofollow.replace_at(folder, rel, change.new, task.pk)


def _prune_parents(task: Task, path: str, views: dict[str, Stack]) -> None:
    """Remove directories the task deleted, once the deletions emptied them."""
    name, rest = _split(task, path)
    parent = rest.rsplit("/", 1)[0] if "/" in rest else ""
    while parent:
        found = views[name].lookup(parent) if name in views else None
        if found is not None and found.kind == DIR:
            return
        folder, rel = locate(task, f"{name}/{parent}" if name else parent)
        if not nofollow.remove_empty_tree_at(folder, rel):
            return  # something the owner keeps is in it
        parent = parent.rsplit("/", 1)[0] if "/" in parent else ""

"""Folder tasks: Keep or Undo, with conflict detection.

A folder task works on a layer over the owner's real folder; nothing touches the folder until
Keep. To know whether the owner changed a path the task also changed, the box keeps:

- at start, a manifest of the folder (kind, size, mtime per path: a stat walk, no reads);
- at the end, for each path the task touched whose stat still matches the start, its SHA-256
  (the file is unchanged since start by stat, so this is its content at start).

Keep applies the change set only when every touched path still has its start kind, size, mtime
and hash (or already holds the task's version: a Keep interrupted by a crash is completed by the
next one). Otherwise ``review=conflict``, nothing is applied, and the conflicting paths are
reported. Files are replaced atomically: written next to the target, fsynced, renamed over it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from boxsite.errors import Conflict, Forbidden
from boxsite.principal import Principal
from tasks.events import record_event
from tasks.layers import paths
from tasks.layers.base import Root
from tasks.layers.copy import snapshot
from tasks.layers.diff import DELETED, Change
from tasks.layers.locks import layer_lock
from tasks.layers.stack import DIR, Stack, same_content
from tasks.layers.tree import Meta, write_atomically
from tasks.models import EventKind, Layer, LayerState, Task
from tasks.states import State

PENDING, KEPT, CONFLICT, UNDONE = "pending", "kept", "conflict", "undone"


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


def real_path(task: Task, path: str) -> Path:
    from tasks.layers.task_view import folder_names

    name, rest = _split(task, path)
    folders = dict(folder_names(task.folders))
    folder = Path(task.folders[0]) if not name else folders[name]
    return folder / rest


def _hash(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_entry(path: Path) -> list[Any] | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
    return [kind, st.st_size, st.st_mtime_ns]


def record_touched(task: Task, roots: list[Root]) -> None:
    """When the task's layer is sealed: the start hash of every path it touched."""
    from tasks.layers.task_view import changes_of

    try:
        start: dict[str, dict[str, list[Any]]] = json.loads(_start_file(task.pk).read_text())
    except FileNotFoundError:
        start = {}
    layer = Layer.objects.get(task=task)
    touched: dict[str, dict[str, Any]] = {}
    for change in changes_of(task, layer, roots):
        name, rest = _split(task, change.path)
        before = start.get(name, {}).get(rest)
        real = real_path(task, change.path)
        now = _stat_entry(real)
        same = before is not None and now is not None and now == list(before[:3])
        touched[change.path] = {"start": list(before[:3]) if before else None,
                                "hash": _hash(real) if same and now and now[0] != "d" else None}
    write_atomically(_touched_file(task.pk), json.dumps(touched).encode())


def _already_ours(change: Change, real: Path) -> bool:
    if change.kind == DELETED:
        return not os.path.lexists(real)
    return change.new is not None and os.path.lexists(real) and same_content(change.new, real)


def find_conflicts(task: Task, changes: list[Change]) -> list[str]:
    try:
        touched: dict[str, dict[str, Any]] = json.loads(_touched_file(task.pk).read_text())
    except FileNotFoundError:
        touched = {}
    conflicts: list[str] = []
    for change in changes:
        real = real_path(task, change.path)
        if _already_ours(change, real):
            continue
        record = touched.get(change.path, {"start": None, "hash": None})
        now = _stat_entry(real)
        start = record["start"]
        if start is None:
            if now is not None:
                conflicts.append(change.path)  # the owner created it meanwhile
        elif now is None or now != start or record["hash"] is None or _hash(real) != record["hash"]:
            conflicts.append(change.path)
        elif not _inside_folder(task, real):
            conflicts.append(change.path)
    return conflicts


def _inside_folder(task: Task, real: Path) -> bool:
    """The target's directory resolves inside one of the task's folders (no symlinked escape)."""
    parent = real.parent.resolve()
    return any(parent == Path(f) or Path(f) in parent.parents for f in task.folders)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _owner_like(reference: Path, target: Path) -> None:
    if os.geteuid() == 0:
        st = os.lstat(reference)
        os.lchown(target, st.st_uid, st.st_gid)


def _replace(source: Path, real: Path, task_id: str) -> None:
    """Put ``source``'s content at ``real`` atomically: write beside it, fsync, rename over."""
    if not real.parent.is_dir():
        real.parent.mkdir(parents=True)
    if not _inside_folder_parent(real):
        raise Conflict(f"'{real}' would be written outside the folder", field="review")
    tmp = real.with_name(f".{real.name}.box-{task_id}.tmp")
    if os.path.lexists(tmp):
        tmp.unlink()
    if source.is_symlink():
        os.symlink(os.readlink(source), tmp)
    else:
        shutil.copy2(source, tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
    _owner_like(real if os.path.lexists(real) else real.parent, tmp)
    if os.path.isdir(real) and not os.path.islink(real):
        shutil.rmtree(real)
    os.replace(tmp, real)
    _fsync_dir(real.parent)


def _inside_folder_parent(real: Path) -> bool:
    return not real.parent.is_symlink()


def _task_views(task: Task) -> dict[str, Stack]:
    """Each folder as the task left it (its layer over the folder), to tell which directories
    it deleted."""
    from tasks.layers.task_view import _tree_for, roots_for

    layer = Layer.objects.get(task=task)
    meta = Meta.load(paths.layer_dir(task.pk))
    return {root.name: Stack([_tree_for(paths.layer_dir(task.pk), meta, root.name), *root.lowers])
            for root in roots_for(task, layer, for_mount=False)}


def _apply(task: Task, changes: list[Change]) -> None:
    views = _task_views(task)
    deletions = [c for c in changes if c.kind == DELETED]
    for change in sorted(deletions, key=lambda c: c.path.count("/"), reverse=True):
        real = real_path(task, change.path)
        if os.path.lexists(real):
            if real.is_dir() and not real.is_symlink():
                shutil.rmtree(real)
            else:
                real.unlink()
        _prune_parents(task, change.path, views)
    for change in changes:
        if change.kind != DELETED and change.new is not None:
            _replace(change.new, real_path(task, change.path), task.pk)


def _prune_parents(task: Task, path: str, views: dict[str, Stack]) -> None:
    """Remove directories the task deleted, once the deletions emptied them."""
    name, rest = _split(task, path)
    parent = rest.rsplit("/", 1)[0] if "/" in rest else ""
    while parent:
        found = views[name].lookup(parent) if name in views else None
        if found is not None and found.kind == DIR:
            return
        if not _remove_empty_tree(real_path(task, f"{name}/{parent}" if name else parent)):
            return  # something the owner keeps is in it
        parent = parent.rsplit("/", 1)[0] if "/" in parent else ""


def _remove_empty_tree(directory: Path) -> bool:
    """Remove ``directory`` if it holds nothing but (empty) directories."""
    if not directory.is_dir() or directory.is_symlink():
        return not os.path.lexists(directory)
    for child in directory.iterdir():
        if not _remove_empty_tree(child):
            return False
    directory.rmdir()
    return True


def _set_review(task: Task, review: str, summary: str, data: dict[str, Any]) -> Task:
    with transaction.atomic():
        moved = Task.objects.filter(pk=task.pk, version=task.version, state=State.DONE).update(
            review=review, version=F("version") + 1, updated_at=timezone.now())
        if moved != 1:
            raise Conflict("the task changed meanwhile; reload and try again", field="version")
        task.review, task.version = review, task.version + 1
        record_event(task, EventKind.NOTE, summary, {"review": review, **data})
        if review == KEPT:
            Layer.objects.filter(task=task).update(state=LayerState.APPLIED, applied_at=timezone.now())
    return task


def keep_review(principal: Principal, task_id: str) -> tuple[Task, list[str]]:
    """Apply a finished folder task's changes to the real folders, or report the conflicts."""
    from tasks.layers.task_view import changes_of, seal_layer
    from tasks.services import get_task_for

    task = get_task_for(principal, task_id)
    if not task.folders:
        raise Conflict("only folder tasks wait for Keep; a workspace task joined its workspace when it finished",
                       field="review")
    if not principal.can_use_folders:
        raise Forbidden("only the owner can keep changes to folders", field="review")
    if task.state != State.DONE or task.review not in (PENDING, CONFLICT):
        raise Conflict(f"a {task.state} task with review '{task.review or 'none'}' cannot be kept",
                       field="review", state=task.state)
    seal_layer(task.pk)
    with layer_lock(task.pk):
        layer = Layer.objects.get(task=task)
        changes = changes_of(task, layer)
        conflicts = find_conflicts(task, changes)
        if conflicts:
            shown = ", ".join(conflicts[:5]) + (" …" if len(conflicts) > 5 else "")
            task = _set_review(task, CONFLICT, f"not kept: you changed {shown} since the task started; nothing was applied",
                               {"conflicts": conflicts})
            return task, conflicts
        _apply(task, changes)
        task = _set_review(task, KEPT, f"kept: {len(changes)} change(s) applied to your folder",
                           {"applied": [c.path for c in changes[:500]]})
    return task, []

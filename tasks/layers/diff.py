"""A task's change set and its unified diff.

The change set of a layer is read from the layer alone (its entries and markers), looking up
only those paths in the view beneath it: the cost grows with the change, not the workspace.
Text files get a unified diff; binary files (a NUL byte, or not UTF-8) are named, not dumped.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.layers.paths import join
from tasks.layers.stack import DIR, View, same_content, walk_files
from tasks.layers.tree import WHITEOUT, LayerTree

ADDED, MODIFIED, DELETED = "added", "modified", "deleted"
MAX_TEXT_BYTES = 1 << 20  # a file bigger than this is named, not diffed
MAX_DIFF_CHARS = 2 << 20  # the whole diff is cut here (``truncated``)


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # ADDED, MODIFIED, DELETED
    new: Path | None = None  # the file as the task left it
    old: Path | None = None  # the file as the task found it


def layer_changes(tree: LayerTree, lower: View, prefix: str = "") -> list[Change]:
    """What ``tree`` changes over ``lower``, file by file (directories are implied by files).

    ``prefix`` names the tree's place in the view (a folder of a multi-folder task).
    """
    changes: dict[str, Change] = {}

    def deleted_under(rel: str, keep: LayerTree | None = None) -> None:
        for path, found in walk_files(lower, join(prefix, rel) if prefix else rel):
            inner = path[len(prefix) + 1:] if prefix else path
            if keep is not None:
                entry = keep.entry(inner)
                if entry is not None and entry.kind not in (WHITEOUT, DIR):
                    continue  # replaced, not deleted: counted as modified when visited
            changes.setdefault(path, Change(path, DELETED, old=found.path))

    def visit(rel: str) -> None:
        for name, entry in sorted(tree.children(rel).items()):
            inner = join(rel, name)
            path = join(prefix, inner) if prefix else inner
            below = lower.lookup(path)
            if entry.kind == WHITEOUT:
                if below is not None:
                    deleted_under(inner)
            elif entry.kind == DIR:
                if below is not None and below.kind != DIR:
                    changes[path] = Change(path, DELETED, old=below.path)
                elif below is not None and entry.opaque:
                    deleted_under(inner, keep=tree)
                visit(inner)
            else:
                new = tree.path(inner)
                if below is None:
                    changes[path] = Change(path, ADDED, new=new)
                elif below.kind == DIR:
                    deleted_under(inner)
                    changes[path] = Change(path, ADDED, new=new)
                elif below.path is not None and not same_content(new, below.path):
                    changes[path] = Change(path, MODIFIED, new=new, old=below.path)

    visit("")
    return sorted(changes.values(), key=lambda c: c.path)


def _read(path: Path | None) -> bytes | None:
    if path is None:
        return b""
    if path.is_symlink():
        return f"-> {path.readlink()}\n".encode()
    if path.stat().st_size > MAX_TEXT_BYTES:
        return None
    return path.read_bytes()


def _text(data: bytes | None) -> str | None:
    if data is None or b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def render(changes: list[Change]) -> dict[str, Any]:
    """The API's diff body: the three path lists, the binary ones, and one unified diff."""
    parts: list[str] = []
    size = 0
    truncated = False
    binary: list[str] = []
    for change in changes:
        old, new = _text(_read(change.old)), _text(_read(change.new))
        if old is None or new is None:
            binary.append(change.path)
            piece = f"Binary files {'/dev/null' if change.kind == ADDED else 'a/' + change.path} and " \
                    f"{'/dev/null' if change.kind == DELETED else 'b/' + change.path} differ\n"
        else:
            piece = "".join(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile="/dev/null" if change.kind == ADDED else f"a/{change.path}",
                tofile="/dev/null" if change.kind == DELETED else f"b/{change.path}",
            ))
            if piece and not piece.endswith("\n"):
                piece += "\n\\ No newline at end of file\n"
            if not piece:  # same text, different permissions
                piece = f"mode changed: {change.path}\n"
        if size + len(piece) > MAX_DIFF_CHARS:
            truncated = True
            break
        parts.append(piece)
        size += len(piece)
    return {
        "added": [c.path for c in changes if c.kind == ADDED],
        "modified": [c.path for c in changes if c.kind == MODIFIED],
        "deleted": [c.path for c in changes if c.kind == DELETED],
        "binary": binary,
        "diff": "".join(parts),
        "truncated": truncated,
    }


def empty() -> dict[str, Any]:
    return render([])

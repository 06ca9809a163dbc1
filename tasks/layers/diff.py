"""A task's change set and its unified diff.

The change set of a layer is read from the layer alone (its entries and markers), looking up
only those paths in the view beneath it: the cost grows with the change, not the workspace.
Text files get a unified diff; binary files (a NUL byte, or not UTF-8) are named, not dumped;
special files (FIFO, socket, device) are named with their type and never opened.
"""
from __future__ import annotations

import difflib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, TypedDict

from boxsite.core.shapes import Doc
from tasks.layers.nofollow import NotRegular, open_regular
from tasks.layers.paths import join, show
from tasks.layers.stack import DIR, View, same_content, walk_files
from tasks.layers.tree import SPECIAL, WHITEOUT, LayerTree, kind_of, special_type

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

    ``prefix`` names the tree's place in the view (a folder of a multi-folder task): ``lower`` is
    that folder's own stack, so paths are looked up without it and reported with it.
    """
    changes: dict[str, Change] = {}

    def shown(inner: str) -> str:
        return join(prefix, inner) if prefix else inner

    def deleted_under(rel: str, keep: LayerTree | None = None) -> None:
        for inner, found in walk_files(lower, rel):
            if keep is not None:
                entry = keep.entry(inner)
                if entry is not None and entry.kind not in (WHITEOUT, DIR):
                    continue  # replaced, not deleted: counted as modified when visited
            changes.setdefault(shown(inner), Change(shown(inner), DELETED, old=found.path))

    def visit(rel: str) -> None:
        for name, entry in sorted(tree.children(rel).items()):
            inner = join(rel, name)
            path = shown(inner)
            below = lower.lookup(inner)
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


def special_of(path: Path | None) -> str | None:
    """The type of a special file (fifo, socket, device), or None for a file, link or nothing."""
    if path is None:
        return None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return special_type(st) if kind_of(st) == SPECIAL else None


def _read(path: Path | None) -> bytes | None:
    """A side's bytes for the text diff (b'' for no file); None when it is not shown as text.
    Never follows a link and never opens a special file."""
    if path is None:
        return b""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # removed since it was listed (a running task, an undo): not shown as text
    if stat.S_ISLNK(st.st_mode):
        return f"-> {show(os.readlink(path))}\n".encode()
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TEXT_BYTES:
        return None
    try:
        fd = open_regular(path)
    except (NotRegular, FileNotFoundError):
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(MAX_TEXT_BYTES + 1)


def _text(data: bytes | None) -> str | None:
    if data is None or b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _piece(change: Change, path: str) -> tuple[str, bool]:
    """One change's part of the diff text, and whether it was named as binary."""
    source = "/dev/null" if change.kind == ADDED else f"a/{path}"
    target = "/dev/null" if change.kind == DELETED else f"b/{path}"
    specials = [t for t in (special_of(change.old), special_of(change.new)) if t]
    if specials:
        return f"Special file {path} ({', '.join(dict.fromkeys(specials))}): listed, never opened\n", False
    old, new = _text(_read(change.old)), _text(_read(change.new))
    if old is None or new is None:
        return f"Binary files {source} and {target} differ\n", True
    piece = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                         fromfile=source, tofile=target))
    if piece and not piece.endswith("\n"):
        piece += "\n\\ No newline at end of file\n"
    if not piece and change.kind != MODIFIED:  # an empty file added or deleted: the headers alone
        piece = f"--- {source}\n+++ {target}\n"
    elif not piece:  # same text, different permissions
        piece = f"mode changed: {path}\n"
    return piece, False


class SpecialChange(TypedDict):
    path: str
    type: str


class DiffBody(TypedDict):
    added: list[str]
    modified: list[str]
    deleted: list[str]
    binary: list[str]
    special: Annotated[list[SpecialChange], Doc("changed paths that are not regular files, with what they are")]
    diff: Annotated[str, Doc("one unified diff of the text files")]
    truncated: bool


class Diff(DiffBody):
    task: str


def render(changes: list[Change]) -> DiffBody:
    """The API's diff body: the three path lists, the binary and special ones, and one unified
    diff. Paths are shown as ``paths.show`` writes them (a name's non-UTF-8 bytes escaped)."""
    parts: list[str] = []
    size = 0
    truncated = False
    binary: list[str] = []
    special: list[SpecialChange] = []
    for change in changes:
        path = show(change.path)
        kind = special_of(change.new) or special_of(change.old)
        if kind:
            special.append({"path": path, "type": kind})
        piece, is_binary = _piece(change, path)
        if is_binary:
            binary.append(path)
        if size + len(piece) > MAX_DIFF_CHARS:
            truncated = True
            break
        parts.append(piece)
        size += len(piece)
    return {
        "added": [show(c.path) for c in changes if c.kind == ADDED],
        "modified": [show(c.path) for c in changes if c.kind == MODIFIED],
        "deleted": [show(c.path) for c in changes if c.kind == DELETED],
        "binary": binary,
        "special": special,
        "diff": "".join(parts),
        "truncated": truncated,
    }


def empty() -> DiffBody:
    return render([])

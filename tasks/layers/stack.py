"""The stack: a workspace's base plus the layers of its done tasks, and how a path resolves
through it.

``Stack`` reads a view without mounting anything (the portal's browser, diffs' old side): a
path is looked up component by component, newest layer first, exactly as overlayfs does: a
whiteout hides everything beneath, a non-directory ends the merge, an opaque directory hides
the directories beneath it. ``FolderSet`` puts several stacks side by side under their names.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tasks.layers.nofollow import open_regular
from tasks.layers.paths import join
from tasks.layers.tree import DIR, FILE, LINK, SPECIAL, WHITEOUT, Entry, LayerTree


@dataclass
class Found:
    kind: str  # DIR, FILE, LINK or SPECIAL
    path: Path | None = None  # the real file for FILE/LINK (topmost layer that has it)
    trees: list[LayerTree] = field(default_factory=list)  # for DIR: layers that merge into it


class View(Protocol):
    def lookup(self, rel: str) -> Found | None: ...
    def listdir(self, rel: str) -> dict[str, Found]: ...


class Stack:
    """``trees`` newest first; the last is the base (a plain tree)."""

    def __init__(self, trees: list[LayerTree]) -> None:
        self.trees = trees

    def __repr__(self) -> str:
        return f"Stack({self.trees})"

    def lookup(self, rel: str) -> Found | None:
        candidates: list[LayerTree] = []
        for tree in self.trees:
            root = tree.entry("")
            if root is None or root.kind != DIR:
                continue
            candidates.append(tree)
            if root.opaque:
                break
        if not rel:
            return Found(DIR, trees=candidates)
        parts = rel.split("/")
        prefix = ""
        for index, part in enumerate(parts):
            prefix = join(prefix, part)
            last = index == len(parts) - 1
            merged: list[LayerTree] = []
            for tree in candidates:
                entry = tree.entry(prefix)
                if entry is None:
                    continue
                if entry.kind == WHITEOUT:
                    break
                if entry.kind == DIR:
                    merged.append(tree)
                    if entry.opaque:
                        break
                    continue
                if not merged:  # the topmost entry is a file or link
                    return Found(entry.kind, path=tree.path(prefix)) if last else None
                break  # a non-directory under a directory ends the merge
            if not merged:
                return None
            candidates = merged
        return Found(DIR, trees=candidates)

    def listdir(self, rel: str) -> dict[str, Found]:
        found = self.lookup(rel)
        if found is None or found.kind != DIR:
            return {}
        result: dict[str, Found] = {}
        hidden: set[str] = set()
        for tree in found.trees:
            for name, entry in tree.children(rel).items():
                if name in result or name in hidden:
                    continue
                if entry.kind == WHITEOUT:
                    hidden.add(name)
                elif entry.kind == DIR:
                    result[name] = Found(DIR)
                else:
                    result[name] = Found(entry.kind, path=tree.path(join(rel, name)))
                    hidden.add(name)
            if _opaque(tree, rel):
                break
        return result


def _opaque(tree: LayerTree, rel: str) -> bool:
    entry = tree.entry(rel)
    return entry is not None and entry.opaque


class FolderSet:
    """Several folders side by side: ``<name>/...`` resolves inside that folder's stack."""

    def __init__(self, stacks: dict[str, Stack]) -> None:
        self.stacks = stacks

    def lookup(self, rel: str) -> Found | None:
        if not rel:
            return Found(DIR)
        name, _, rest = rel.partition("/")
        stack = self.stacks.get(name)
        return stack.lookup(rest) if stack is not None else None

    def listdir(self, rel: str) -> dict[str, Found]:
        if not rel:
            return {name: Found(DIR) for name in self.stacks}
        name, _, rest = rel.partition("/")
        stack = self.stacks.get(name)
        return stack.listdir(rest) if stack is not None else {}


def walk_files(view: View, rel: str = "") -> Iterator[tuple[str, Found]]:
    """Every file and link at or below ``rel`` (a file ``rel`` yields itself)."""
    found = view.lookup(rel)
    if found is None:
        return
    if found.kind != DIR:
        yield rel, found
        return
    for name, child in sorted(view.listdir(rel).items()):
        path = join(rel, name)
        if child.kind == DIR:
            yield from walk_files(view, path)
        else:
            yield path, child


def same_content(a: Path, b: Path) -> bool:
    """Byte-for-byte (and kind and permission bits) equal; links compare their targets, special
    files their type and device number (they are never opened)."""
    sa, sb = os.lstat(a), os.lstat(b)
    if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
        return False
    if stat.S_ISLNK(sa.st_mode):
        return os.readlink(a) == os.readlink(b)
    if stat.S_IMODE(sa.st_mode) != stat.S_IMODE(sb.st_mode) or sa.st_size != sb.st_size:
        return False
    if not stat.S_ISREG(sa.st_mode):
        return sa.st_rdev == sb.st_rdev
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return True
    fa = open_regular(a)
    try:
        fb = open_regular(b)
        try:
            while True:
                chunk_a, chunk_b = os.read(fa, 1 << 16), os.read(fb, 1 << 16)
                if chunk_a != chunk_b:
                    return False
                if not chunk_a:
                    return True
        finally:
            os.close(fb)
    finally:
        os.close(fa)


__all__ = ["DIR", "FILE", "LINK", "SPECIAL", "Entry", "FolderSet", "Found", "Stack", "View", "same_content", "walk_files"]

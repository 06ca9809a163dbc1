"""The layer format: one directory tree of changed entries plus deletion markers.

A layer is read the way overlayfs reads an upper directory. Two spellings of the markers exist:

- ``native`` (written by the overlay driver, as root): a deletion is a whiteout, a character
  device 0/0; a directory that hides everything beneath it carries ``trusted.overlay.opaque=y``.
  Such a layer can be stacked directly as an overlayfs lower directory.
- ``portable`` (written by the copy driver, no privileges): the same markers are listed in the
  layer's ``meta.json`` (``deleted``, ``opaque``), so no special files are needed.

``LayerTree`` reads either. ``apply_layer`` lays one layer over a directory: to materialise a
view (markers dropped, deletions performed) or to compact layers (markers kept).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tasks.layers.paths import join, parent_of

log = logging.getLogger(__name__)

WHITEOUT = "whiteout"
DIR = "dir"
FILE = "file"
LINK = "link"
SPECIAL = "special"  # a FIFO, socket or device: listed, never opened
OPAQUE_XATTR = "trusted.overlay.opaque"
ORIGIN_XATTR = "trusted.overlay.origin"


@dataclass(frozen=True)
class Entry:
    kind: str
    opaque: bool = False


# A sealed layer's meta.json, by path: (the file's version, its content). Every stack a task
# opens, seals or refreshes reads the meta of each of its layers, and sealed layers are most of
# them and rarely change. A version is the file's identity and timestamps: every save replaces
# the file (``write_atomically``: a new inode, while the old one is still held), so a rewrite
# (a reopening, a conversion to native markers) is always a new version. Only plain values are
# kept, so the cache holds across fork and threads.
_SEALED_METAS_MAX = 4096
_sealed_metas: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}


def _version(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Meta:
    """A layer's ``meta.json``. ``sealed``: the layer is final and will not change again.
    ``sealing``: a copy seal in progress, by root name: what its scan found, journaled before its
    first move (``CopyDriver.seal``). Never saved in a sealed meta: the save that seals the
    layer is the one that ends the journal, in one rename."""

    format: str = "native"
    driver: str = ""
    deleted: set[str] = field(default_factory=set)
    opaque: set[str] = field(default_factory=set)
    sealed: bool = False
    sealing: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path) -> Meta:
        """A fresh copy each time (callers change it and save it). A sealed layer's meta is
        read from disk once per process and version of the file (``_sealed_metas``)."""
        name = os.path.join(directory, "meta.json")
        cached = _sealed_metas.get(name)
        try:
            if cached is not None and cached[0] == _version(os.stat(name)):
                raw = cached[1]
            else:
                with open(name, "rb") as handle:
                    version = _version(os.fstat(handle.fileno()))
                    raw = json.loads(handle.read())
                if raw.get("sealed"):
                    if len(_sealed_metas) >= _SEALED_METAS_MAX:
                        _sealed_metas.clear()
                    _sealed_metas[name] = (version, raw)
        except (FileNotFoundError, NotADirectoryError):
            return cls()
        return cls(format=raw.get("format", "native"), driver=raw.get("driver", ""),
                   deleted=set(raw.get("deleted", [])), opaque=set(raw.get("opaque", [])),
                   sealed=bool(raw.get("sealed")), sealing=raw.get("sealing", {}))

    def save(self, directory: Path, *, sync_dir: bool = False) -> None:
        body: dict[str, Any] = {"format": self.format, "driver": self.driver, "deleted": sorted(self.deleted),
                                "opaque": sorted(self.opaque), "sealed": self.sealed}
        if self.sealing and not self.sealed:
            body["sealing"] = self.sealing
        write_atomically(directory / "meta.json", json.dumps(body).encode(), sync_dir=sync_dir)
        _sealed_metas.pop(os.path.join(directory, "meta.json"), None)


def write_atomically(target: Path, data: bytes, *, sync_dir: bool = False) -> None:
    """``sync_dir``: the rename is on disk too when this returns (the directory is synced), for
    a record that the changes made after it rely on (a copy seal's journal)."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    if sync_dir:
        fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _lstat(path: Path | str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def has_opaque_xattr(path: Path | str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False  # no xattr, or a filesystem/OS without them


def kind_of(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return DIR
    if stat.S_ISLNK(st.st_mode):
        return LINK
    if stat.S_ISREG(st.st_mode):
        return FILE
    return SPECIAL


def special_type(st: os.stat_result) -> str:
    """What a special file is, in the words the API shows."""
    if stat.S_ISFIFO(st.st_mode):
        return "fifo"
    if stat.S_ISSOCK(st.st_mode):
        return "socket"
    if stat.S_ISCHR(st.st_mode):
        return "character device"
    if stat.S_ISBLK(st.st_mode):
        return "block device"
    return "special file"


class LayerTree:
    """One directory read as a layer. ``plain`` trees (a workspace's base, a real folder) have
    no markers: a character device there is just a file."""

    def __init__(self, root: Path, meta: Meta | None = None, *, plain: bool = False) -> None:
        self.root = root
        self._root_name = os.fspath(root)
        self.plain = plain
        self.deleted = frozenset(meta.deleted) if meta else frozenset()
        self.opaque = frozenset(meta.opaque) if meta else frozenset()
        self._deleted_by_parent: dict[str, set[str]] = {}
        for rel in self.deleted:
            self._deleted_by_parent.setdefault(parent_of(rel), set()).add(rel.rsplit("/", 1)[-1])

    @classmethod
    def of_layer(cls, directory: Path) -> LayerTree:
        return cls(directory / "upper", Meta.load(directory))

    def __repr__(self) -> str:
        return f"LayerTree({self.root})"

    def path(self, rel: str) -> Path:
        return self.root / rel if rel else self.root

    def entry(self, rel: str) -> Entry | None:
        name = f"{self._root_name}/{rel}" if rel else self._root_name
        st = _lstat(name)
        if st is None:
            return Entry(WHITEOUT) if rel in self.deleted else None
        if self.plain:
            return Entry(kind_of(st))
        if is_whiteout(st):
            return Entry(WHITEOUT)
        if stat.S_ISDIR(st.st_mode):
            return Entry(DIR, opaque=rel in self.opaque or has_opaque_xattr(name))
        return Entry(kind_of(st))

    def children(self, rel: str) -> dict[str, Entry]:
        """The entries of directory ``rel`` in this layer alone (whiteouts included)."""
        found: dict[str, Entry] = {}
        try:
            with os.scandir(self.path(rel)) as it:
                for item in it:
                    entry = self.entry(join(rel, item.name))
                    if entry is not None:
                        found[item.name] = entry
        except (FileNotFoundError, NotADirectoryError):
            pass
        for name in self._deleted_by_parent.get(rel, ()):
            found.setdefault(name, Entry(WHITEOUT))
        return found

    def walk(self, rel: str = "") -> Iterator[tuple[str, Entry]]:
        """Every entry below ``rel``, parents before children."""
        for name, entry in sorted(self.children(rel).items()):
            child = join(rel, name)
            yield child, entry
            if entry.kind == DIR:
                yield from self.walk(child)


class Markers(Protocol):
    """How deletions and opaque directories are written into a layer being built."""

    format: str

    def whiteout(self, root: Path, rel: str) -> None: ...
    def opaque(self, root: Path, rel: str) -> None: ...
    def is_whiteout(self, root: Path, rel: str) -> bool: ...
    def forget(self, rel: str) -> None: ...


def mark_may_hold_whiteouts(directory: Path) -> None:
    """overlayfs hides a lower directory's whiteouts only when it knows the directory may hold
    some: when it merges with one beneath, or carries an origin xattr. Once a task beneath is
    undone a directory may have nothing beneath it, and its whiteouts would be listed as
    unreadable entries; so every directory holding one carries the xattr. An empty value means
    "origin unknown", which overlayfs accepts; a sealed layer is only ever a lower layer."""
    try:
        os.getxattr(directory, ORIGIN_XATTR, follow_symlinks=False)
    except OSError:
        os.setxattr(directory, ORIGIN_XATTR, b"", follow_symlinks=False)


class NativeMarkers:
    format = "native"

    def whiteout(self, root: Path, rel: str) -> None:
        os.mknod(root / rel, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        mark_may_hold_whiteouts((root / rel).parent)

    def opaque(self, root: Path, rel: str) -> None:
        os.setxattr(root / rel, OPAQUE_XATTR, b"y", follow_symlinks=False)

    def is_whiteout(self, root: Path, rel: str) -> bool:
        st = _lstat(root / rel)
        return st is not None and is_whiteout(st)

    def forget(self, rel: str) -> None:
        """Native markers live in the tree; removing the path removes them."""


class PortableMarkers:
    format = "portable"

    def __init__(self, meta: Meta) -> None:
        self.meta = meta

    def whiteout(self, root: Path, rel: str) -> None:
        self.meta.deleted.add(rel)

    def opaque(self, root: Path, rel: str) -> None:
        self.meta.opaque.add(rel)

    def is_whiteout(self, root: Path, rel: str) -> bool:
        return rel in self.meta.deleted

    def forget(self, rel: str) -> None:
        prefix = rel + "/"
        self.meta.deleted = {p for p in self.meta.deleted if p != rel and not p.startswith(prefix)}
        self.meta.opaque = {p for p in self.meta.opaque if p != rel and not p.startswith(prefix)}


def remove_path(path: Path) -> None:
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def link_or_copy(source: Path, target: Path) -> None:
    """Finished layers never change, so a file can be shared by a hard link instead of copied."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
            raise
        copy_entry(source, target)


def copy_entry(source: Path, target: Path) -> None:
    """A private copy (the target may be changed later, so never a shared inode). A special
    file is made again as a node, never opened (a FIFO would block the copy forever)."""
    st = os.lstat(source)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISREG(st.st_mode):
        shutil.copy2(source, target, follow_symlinks=False)
    elif stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "copy_entry copies files, not directories", str(source))
    else:
        copy_special(source, st, target)


def copy_special(source: Path, st: os.stat_result, target: Path) -> None:
    """A FIFO or socket node is made again (it holds no data); a device node only where the box
    may make one, else it is skipped with a warning: never opened either way."""
    try:
        os.mknod(target, st.st_mode, st.st_rdev)
    except PermissionError:
        log.warning("the %s %s was not copied: this box may not create device nodes", special_type(st), source)
        return
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def apply_layer(src: LayerTree, dst: Path, markers: Markers | None, *, share: bool) -> None:
    """Lay ``src`` over directory ``dst`` as overlayfs would show ``src`` above it.

    ``markers=None`` materialises (a whiteout deletes, an opaque directory replaces). With
    markers the result is itself a layer equal to ``dst`` then ``src`` stacked. ``share`` hard
    links files instead of copying (only when ``dst`` is never written to afterwards).
    """
    place = link_or_copy if share else copy_entry

    def visit(rel: str) -> None:
        for name, entry in sorted(src.children(rel).items()):
            child = join(rel, name)
            target = dst / child
            if entry.kind == WHITEOUT:
                remove_path(target)
                if markers is not None:
                    markers.forget(child)
                    markers.whiteout(dst, child)
            elif entry.kind == DIR:
                current = _lstat(target)
                hid_below = markers is not None and markers.is_whiteout(dst, child)
                if entry.opaque or current is None or not stat.S_ISDIR(current.st_mode):
                    remove_path(target)
                    if markers is not None:
                        markers.forget(child)
                    target.mkdir()
                    # a directory over a deletion hides what the deletion hid: it is opaque
                    if markers is not None and (entry.opaque or hid_below):
                        markers.opaque(dst, child)
                shutil.copystat(src.path(child), target, follow_symlinks=False)
                visit(child)
            else:
                remove_path(target)
                if markers is not None:
                    markers.forget(child)
                place(src.path(child), target)

    dst.mkdir(parents=True, exist_ok=True)
    visit("")


def copy_layer(src: LayerTree, dst: Path, markers: Markers) -> None:
    """A new layer equal to ``src`` (files shared by hard links), markers rewritten for ``dst``."""
    apply_layer(src, dst, markers, share=True)

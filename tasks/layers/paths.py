"""Where layers, views and caches live under ``BOX_DATA_DIR``, and the one path cleaner.

``tasks/``, ``mounts/`` and ``trash/`` belong to one machine and live under ``BOX_LOCAL_DIR``
(by default the data directory itself); the rest is shared by every machine of the box.

    layers/<task>/upper/         the task's own layer (overlay upperdir, or the copy driver's
                                 captured change set); a multi-folder task has upper/<name>/
    layers/<task>/ovl-work/      overlayfs workdir (same filesystem as upper; removed at seal)
    layers/<task>/meta.json      format, driver, portable whiteouts, sealed flag (and a copy
                                 seal's journal until it is sealed)
    tasks/<task>/view/           what the task's processes see (mount point or working copy)
    mounts/<task>/<root>/<n>/    id-mapped lower layers of a sandboxed overlay view
    flats/<workspace>/<key>/     compacted lower layers (see ``compaction``)
    locks/                       flock files that order work across processes
    trash/                       working copies being deleted in the background
"""
from __future__ import annotations

import functools
import os
import posixpath
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from boxsite.core import procs
from boxsite.core.errors import InvalidRequest
from boxsite.core.setting_paths import path_setting
from tasks.layers import mounts

NAME_MAX = 255  # bytes in one name, on Linux's file systems
PATH_MAX = 4096  # bytes in a path, its final NUL included


def data_dir() -> Path:
    return path_setting("BOX_DATA_DIR")


_probe_lock = threading.Lock()
_probed: dict[tuple[str, str], str | None] = {}


def probed(name: str, probe: Callable[[Path], str | None]) -> str | None:
    """What ``probe(data_dir)`` found (None: the feature works; else why not), run once per
    process and data directory: a kernel feature is tried for real on the filesystem layers
    live on (``overlay_refusal``, ``disk.unavailable``)."""
    key = (name, str(settings.BOX_DATA_DIR))
    with _probe_lock:
        if key not in _probed:
            _probed[key] = probe(Path(key[1]))
        return _probed[key]


def probe_dir(data: Path, kind: str) -> Path:
    """Where this process and thread try a kernel feature for real (``layers/.<kind>-<pid>-<thread>``),
    once the ones of processes that are gone are removed: a probe killed between its mount and
    its unmount left both behind, a mount nothing else would ever take down."""
    layers, prefix = data / "layers", f".{kind}-"
    try:
        entries = [entry for entry in os.scandir(layers) if entry.name.startswith(prefix)]
    except FileNotFoundError:
        entries = []
    for entry in entries:
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not procs.alive(int(pid)):
            mounts.unmount_all_under(Path(entry.path))
            shutil.rmtree(entry.path, ignore_errors=True)
    return layers / f"{prefix}{os.getpid()}-{threading.get_ident()}"


def layer_dir(task_id: str) -> Path:
    return _layer_dir(data_dir(), task_id)


@functools.lru_cache(maxsize=4096)
def _layer_dir(root: Path, task_id: str) -> Path:
    return root / "layers" / task_id


def local_dir() -> Path:
    """This machine's part of the data directory (``BOX_LOCAL_DIR``): views, mounts, trash."""
    return path_setting("BOX_LOCAL_DIR") if settings.BOX_LOCAL_DIR else data_dir()


def views_root() -> Path:
    return local_dir() / "tasks"


def lower_mounts_root() -> Path:
    return local_dir() / "mounts"


def task_dir(task_id: str) -> Path:
    return views_root() / task_id


def view_dir(task_id: str) -> Path:
    return task_dir(task_id) / "view"


def trash_dir() -> Path:
    return local_dir() / "trash"


def lower_mounts_dir(task_id: str) -> Path:
    return lower_mounts_root() / task_id


def mount_roots(task_id: str) -> list[Path]:
    """Everything of ``task_id`` that may be mounted: unmount these, deepest first, to end it."""
    return [task_dir(task_id), lower_mounts_dir(task_id)]


def flats_dir(workspace_id: int) -> Path:
    return data_dir() / "flats" / str(workspace_id)


def lock_file(*parts: str) -> Path:
    path = Path(lock_path(*parts))
    ensure_dir(path.parent)
    return path


def ensure_dir(path: Path, mode: int = 0o777) -> Path:
    """Make ``path`` (and parents) exist. Looked at first: a ``mkdir`` of a directory that exists
    fails only after locking its parent for writing (every start made the same few again)."""
    if not os.path.isdir(path):
        path.mkdir(parents=True, exist_ok=True, mode=mode)
    return path


def lock_path(*parts: str) -> str:
    """Where ``lock_file`` puts the lock ``parts`` (its directory may not exist yet)."""
    return os.path.join(data_dir(), "locks", *parts)


def private_dir(path: Path) -> Path:
    """Make ``path`` (and parents) exist; layers and caches are readable by the box alone."""
    return ensure_dir(path, 0o700)


def show(rel: str) -> str:
    """A path as the API shows it. Names are bytes: a byte that is not UTF-8 is written ``\\xNN``
    and a backslash ``\\\\`` (``unshow`` reads both back), so every name can be shown and named."""
    if "\\" not in rel and not any(0xDC80 <= ord(ch) <= 0xDCFF for ch in rel):
        return rel
    out: list[str] = []
    for ch in rel:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    return "".join(out)


def unshow(value: str) -> str:
    """The path ``show`` wrote (a lone backslash before anything else stays a backslash)."""
    if "\\" not in value:
        return value
    raw = bytearray()
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and value[i + 1:i + 2] == "\\":
            raw += b"\\"
            i += 2
        elif ch == "\\" and value[i + 1:i + 2] == "x" and _is_hex(value[i + 2:i + 4]):
            raw.append(int(value[i + 2:i + 4], 16))
            i += 4
        else:
            raw += ch.encode("utf-8", "surrogateescape")
            i += 1
    return bytes(raw).decode("utf-8", "surrogateescape")


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def clean_relative(raw: str | None, *, field: str = "path") -> str:
    """A path inside a view, normalised ('' is the root), as ``show`` writes it. Anything that
    could leave it is refused: absolute paths, '..' components and NUL bytes are a 400."""
    value = unshow((raw or "").strip())
    if "\x00" in value:
        raise InvalidRequest("the path contains a NUL byte", field=field)
    if value.startswith("/"):
        raise InvalidRequest(f"'{value}' is absolute; give a path relative to the root of the view", field=field)
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InvalidRequest(f"'{value}' leaves the view ('..' is not allowed)", field=field)
    # What the file system refuses as too long (ENAMETOOLONG) is refused here, as a 400.
    if any(len(os.fsencode(p)) > NAME_MAX for p in parts) or len(os.fsencode(value)) >= PATH_MAX:
        raise InvalidRequest(f"the path is longer than a file system takes ({NAME_MAX} bytes a name)", field=field)
    return posixpath.join(*parts) if parts else ""


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def parent_of(rel: str) -> str:
    return rel.rsplit("/", 1)[0] if "/" in rel else ""

"""Workspaces: creating them (empty or imported from a directory the owner names) and reading
their current view (the base plus the layers of done tasks), computed on read."""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from django.conf import settings
from django.db import IntegrityError, transaction

from boxsite.core.errors import Conflict, Forbidden, InvalidRequest, NotFound
from boxsite.core.principal import Principal
from boxsite.core.shapes import DateTime, Doc
from boxsite.core.validation import AnyText, Body, existing_dir
from tasks.layers import compaction, paths
from tasks.layers.base import driver_name, get_driver
from tasks.layers.copy import copy_tree
from tasks.layers.nofollow import NotRegular, open_regular
from tasks.layers.stack import DIR, LINK, SPECIAL, Stack
from tasks.layers.task_view import current_stack, seal_stack
from tasks.layers.tree import special_type
from tasks.models import Workspace

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class WorkspaceBody(Body):
    """``POST /api/workspaces``. Checked after the asker's right (a phone may not create one)."""

    name = AnyText(help_text="1-64 lowercase letters, digits, '-' or '_'")
    importFrom = AnyText(required=False, help_text="an absolute directory to copy (owner only)")
MAX_READ = 1 << 20


def get_workspace(name: str) -> Workspace:
    workspace = Workspace.objects.filter(name=name).first()
    if workspace is None:
        raise NotFound(f"no workspace '{name}'")
    return workspace


def create_workspace(principal: Principal, body: Any) -> Workspace:
    """A new workspace with an empty base, or a copy of ``importFrom`` (an absolute directory)."""
    body = WorkspaceBody.parse(body)
    if not principal.can_change_settings:
        raise Forbidden("a paired device cannot create workspaces", field="name")
    name = body.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise InvalidRequest("'name' must be 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit",
                             field="name")
    source = body.get("importFrom")
    if source is not None:
        source = _import_source(principal, source)
    if Workspace.objects.filter(name=name).exists():
        raise Conflict(f"a workspace named '{name}' exists", field="name")
    base = paths.data_dir() / "workspaces" / name
    building = base.with_name(f".{name}.importing")
    shutil.rmtree(building, ignore_errors=True)
    if base.exists():
        raise Conflict(f"'{base.name}' already exists in the box's workspaces directory", field="name")
    if source is not None:
        copy_tree(source, building)
    else:
        building.mkdir(parents=True)
    try:
        with transaction.atomic():
            # Several machines: its base is on this machine's disk, so this machine is its home.
            workspace = Workspace.objects.create(name=name, base_dir=name, machine=settings.BOX_MACHINE)
    except IntegrityError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise Conflict(f"a workspace named '{name}' exists", field="name") from exc
    building.rename(base)
    return workspace


def _import_source(principal: Principal, raw: Any) -> Path:
    if not principal.can_use_folders:
        raise Forbidden("only the owner can import a directory", field="importFrom")
    source = Path(existing_dir(raw, "importFrom"))
    data = paths.data_dir().resolve()
    if source == data or data in source.parents or source in data.parents:
        raise InvalidRequest("a workspace cannot be imported from the box's own data directory", field="importFrom")
    return source


@contextmanager
def view_of(workspace: Workspace) -> Iterator[Stack]:
    """The workspace as new tasks see it: base plus done layers, newest first. Its flat is
    held until the block ends: no task recorded this stack, so a sweep would not keep it."""
    ids = current_stack(workspace)
    markers = get_driver(driver_name()).markers
    seal_stack(workspace, ids, markers)
    with compaction.held_lower_trees(workspace, ids, markers) as trees:
        yield Stack(trees)


class WorkspaceStack(TypedDict):
    separate: Annotated[list[str], Doc("layers a new task mounts on their own, newest first")]
    compacted: Annotated[list[str], Doc("layers a new task mounts inside flats, newest first")]
    flats: Annotated[int, Doc("the flat layers those are merged into")]
    depth: Annotated[int, Doc("the lower layers a new task mounts: the separate ones, the flats and the base")]


class WorkspaceView(TypedDict):
    name: str
    createdAt: DateTime
    driver: str
    layers: list[str]
    stack: WorkspaceStack
    machine: Annotated[str, Doc("several machines: the machine that holds the workspace and runs its tasks ('' on one machine, or before any ran)")]
    movingTo: Annotated[str, Doc("several machines: the machine its layers are being copied to ('' when not moving); its tasks wait meanwhile")]


class WorkspacePage(TypedDict):
    results: list[WorkspaceView]


EntryType = Literal["dir", "file", "link", "special"]


class DirEntry(TypedDict):
    name: str
    path: str
    type: EntryType
    size: NotRequired[int]
    special: NotRequired[Annotated[str, Doc("fifo, socket, character device or block device")]]


class WorkspaceEntry(TypedDict):
    """A folder (its entries), a link (its target) or a file (its text, unless binary)."""

    workspace: str
    path: str
    type: EntryType
    entries: NotRequired[list[DirEntry]]
    target: NotRequired[str]
    special: NotRequired[str]
    size: NotRequired[int]
    binary: NotRequired[bool]
    content: NotRequired[str | None]
    truncated: NotRequired[bool]


def describe(workspace: Workspace) -> WorkspaceView:
    ids = current_stack(workspace)
    markers = get_driver(driver_name()).markers
    own, flats = compaction.split(ids, markers)
    return {
        "name": workspace.name,
        "createdAt": workspace.created_at.isoformat(),
        "driver": driver_name(),
        "layers": ids,
        "stack": {"separate": own, "compacted": compaction.layers_inside(flats), "flats": len(flats),
                  "depth": len(own) + len(flats) + 1},
        "machine": workspace.machine,
        "movingTo": workspace.moving_to,
    }


def browse(workspace: Workspace, raw_path: str | None) -> WorkspaceEntry:
    """List a folder or read a file of the current view. Links are shown, never followed;
    special files (FIFO, socket, device) are listed with their type, never opened. Names are
    shown as ``paths.show`` writes them, and ``path`` is read the same way."""
    rel = paths.clean_relative(raw_path)
    with view_of(workspace) as view:
        return _browse(workspace, view, rel)


def _browse(workspace: Workspace, view: Stack, rel: str) -> WorkspaceEntry:
    found = view.lookup(rel)
    if found is None:
        raise NotFound(f"'{paths.show(rel)}' is not in workspace '{workspace.name}'", field="path")
    name, shown = workspace.name, paths.show(rel)
    if found.kind == DIR:
        entries: list[DirEntry] = []
        for child_name, child in sorted(view.listdir(rel).items()):
            item: DirEntry = {"name": paths.show(child_name), "path": paths.show(paths.join(rel, child_name)),
                              "type": child.kind}  # type: ignore[typeddict-item]  # a kind is one of EntryType
            if child.path is not None and child.kind != LINK:
                st = os.lstat(child.path)
                item["size"] = st.st_size
                if child.kind == SPECIAL:
                    item["special"] = special_type(st)
            entries.append(item)
        return {"workspace": name, "path": shown, "type": "dir", "entries": entries}
    assert found.path is not None
    if found.kind == LINK:
        return {"workspace": name, "path": shown, "type": "link", "target": paths.show(os.readlink(found.path))}
    if found.kind == SPECIAL:
        st = os.lstat(found.path)
        return {"workspace": name, "path": shown, "type": "special", "special": special_type(st), "size": st.st_size,
                "binary": True, "content": None, "truncated": False}
    try:
        return {"workspace": name, "path": shown, "type": "file", **_read(found.path)}
    except NotRegular as exc:
        raise Conflict(f"'{paths.show(rel)}' changed while it was read; try again", field="path") from exc


class FileRead(TypedDict):
    size: int
    binary: bool
    content: str | None
    truncated: bool


def _read(path: Path) -> FileRead:
    fd = open_regular(path)  # a file swapped for a FIFO since the lookup is refused, not waited on
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        data = handle.read(MAX_READ + 1)
    truncated = len(data) > MAX_READ
    data = data[:MAX_READ]
    if b"\x00" in data[:8192]:
        return {"size": st.st_size, "binary": True, "content": None, "truncated": False}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        if not truncated:
            return {"size": st.st_size, "binary": True, "content": None, "truncated": False}
        text = data.decode("utf-8", errors="ignore")
    return {"size": st.st_size, "binary": False, "content": text, "truncated": truncated}


def present_workspace(workspace: Workspace) -> WorkspaceView:
    return describe(workspace)

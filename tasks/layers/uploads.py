"""Files in and out of a workspace through the API: an upload is a layer of its own, recorded as
a task the box does itself (``source`` "upload"), done in the request; a download reads the
workspace's current view.

An upload's layer is written sealed, in the format the box's driver stacks, before its task's
row exists: the file, and each directory above it as the view has it (so the layer holds
exactly the path whose state changes, docs/internals/layers.md#layers). Its task is then moved to
done in one transaction with its layer's row, applied and sealed, and from there it is any done
task: it shows in the workspace's history, its diff names the file, undo takes its layer out of
the stack and leaves later tasks' changes where they are. A crash before that commit leaves a
layer directory no row names, which nothing reads.
"""
from __future__ import annotations

import mimetypes
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings
from django.db import transaction

from boxsite.core.errors import Conflict, Forbidden, InvalidRequest, NotFound, PayloadTooLarge
from boxsite.core.principal import Principal
from tasks import services
from tasks.ids import new_task_id
from tasks.layers import paths
from tasks.layers.base import driver_name, get_driver
from tasks.layers.diff import ADDED, MODIFIED, Change
from tasks.layers.locks import workspace_lock
from tasks.layers.nofollow import NotRegular, open_regular
from tasks.layers.stack import DIR, FILE, LINK, Stack, same_content
from tasks.layers.stack_record import current_stack, write_seal
from tasks.layers.task_view import summarise
from tasks.layers.tree import Meta
from tasks.layers.workspaces import get_workspace, view_of
from tasks.models import Layer, LayerState, Task, Workspace
from tasks.states import State

SOURCE = "upload"
NEW_FILE_MODE = 0o644
NEW_DIR_MODE = 0o755
CHUNK = 1 << 20


def max_bytes() -> int:
    return int(settings.BOX_UPLOAD_MAX_MB) * 1024 * 1024


@dataclass(frozen=True)
class Upload:
    task: Task  # done, its layer applied
    path: str  # as the API shows it
    size: int


def upload_file(principal: Principal, name: str, raw_path: str, body: IO[bytes]) -> Upload:
    """Write ``body`` at ``raw_path`` in workspace ``name`` as a layer of its own, recorded by a
    done task. Only the owner's session and API tokens upload (a
    paired phone does not). The path is read as every path of the API (``paths.clean_relative``);
    a directory or a link above it, or a directory at it, is a conflict: an upload never writes
    through a link, and replaces only a file (or a link, or a special file, by a file)."""
    if not principal.can_upload:
        raise Forbidden("a paired device cannot put files into a workspace", field="path")
    workspace = get_workspace(name)
    rel = paths.clean_relative(raw_path)
    if not rel:
        raise InvalidRequest("name the file to write: /api/workspaces/<name>/files/<path>", field="path")
    task_id = new_task_id()
    directory = paths.layer_dir(task_id)
    paths.private_dir(directory)
    try:
        with view_of(workspace) as view:
            kind, mode = _target(workspace, view, rel)
            upper = directory / "upper"
            _make_parents(view, upper, rel)
            size = _write(body, upper / rel, mode)
            found = view.lookup(rel)
            if found is not None and found.kind == FILE and found.path is not None and same_content(found.path, upper / rel):
                shutil.rmtree(upper)  # the same bytes written again: no change, as for a task
                upper.mkdir()
                kind = None
        driver = get_driver(driver_name())
        Meta(format=driver.markers, driver=driver.name, sealed=True).save(directory, sync_dir=True)
        task = _record(principal, workspace, task_id, rel, size, kind)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return Upload(task, paths.show(rel), size)


def _target(workspace: Workspace, view: Stack, rel: str) -> tuple[str | None, int]:
    """What writing ``rel`` changes (added or modified) and the file's mode: a file replaced
    keeps its permission bits."""
    above = ""
    for part in rel.split("/")[:-1]:
        above = paths.join(above, part)
        found = view.lookup(above)
        if found is None:
            break
        if found.kind != DIR:
            what = "a link" if found.kind == LINK else "not a directory"
            raise Conflict(f"'{paths.show(above)}' in workspace '{workspace.name}' is {what}; an upload writes "
                           "only inside directories", field="path")
    found = view.lookup(rel)
    if found is None:
        return ADDED, NEW_FILE_MODE
    if found.kind == DIR:
        raise Conflict(f"'{paths.show(rel)}' in workspace '{workspace.name}' is a directory", field="path")
    if found.kind == FILE and found.path is not None:
        return MODIFIED, stat.S_IMODE(os.lstat(found.path).st_mode)
    return MODIFIED, NEW_FILE_MODE


def _make_parents(view: Stack, upper: Path, rel: str) -> None:
    """The directories above ``rel`` in the layer, each with the permission bits the view gives
    it (a new one: ``NEW_DIR_MODE``), so none of them reads as changed."""
    upper.mkdir()
    made, above = upper, ""
    for part in rel.split("/")[:-1]:
        above = paths.join(above, part)
        made = made / part
        found = view.lookup(above)
        mode = NEW_DIR_MODE
        if found is not None and found.trees:
            mode = stat.S_IMODE(os.lstat(found.trees[0].root / above).st_mode)
        made.mkdir()
        os.chmod(made, mode)


def _write(body: IO[bytes], target: Path, mode: int) -> int:
    """Copy ``body`` to ``target`` (made here, never followed), at most ``max_bytes``; durable
    before the task that names it commits."""
    limit, size = max_bytes(), 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        while True:
            chunk = body.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"the file is larger than BOX_UPLOAD_MAX_MB ({settings.BOX_UPLOAD_MAX_MB} MB)",
                                      field="body")
            handle.write(chunk)
        handle.flush()
        os.fchmod(fd, mode)
        os.fsync(fd)
    return size


def _record(principal: Principal, workspace: Workspace, task_id: str, rel: str, size: int, kind: str | None) -> Task:
    """The upload's task and layer row, in one transaction: running, then done with its layer
    applied and sealed. The stack it records is the workspace's now (under the lock a start
    takes to record its own), against which its diff is read."""
    shown = paths.show(rel)
    data = {"upload": {"path": shown, "bytes": size}}
    with workspace_lock(workspace.pk), transaction.atomic():
        task = services.begin_box_task(principal, workspace.pk, task_id=task_id, title=f"Upload {shown}",
                                       prompt=f"Put {shown} ({size} bytes) into workspace {workspace.name}",
                                       worker=SOURCE, source=SOURCE, data=data)
        task.layers = current_stack(workspace)
        Task.objects.filter(pk=task.pk).update(layers=task.layers)
        layer = Layer.objects.create(task=task, workspace=workspace, driver=driver_name(),
                                     path=str(paths.layer_dir(task.pk)), state=LayerState.ACTIVE)
        said = f"wrote {shown} ({size} bytes)" if kind else f"{shown} already holds these {size} bytes: nothing changed"
        services.transition(task, State.DONE, summary=f"done: {said}", data=data, progress=1.0)
        layer.refresh_from_db(fields=["state", "applied_at"])
        write_seal(task, layer, summarise([Change(rel, kind)] if kind else []))
    return task


@dataclass(frozen=True)
class Download:
    fd: int
    name: str
    size: int
    content_type: str


def open_file(name: str, raw_path: str) -> Download:
    """A regular file of the workspace as it stands now, opened (the caller closes ``fd``): a
    directory, a link or a special file is a conflict, never followed or opened."""
    workspace = get_workspace(name)
    rel = paths.clean_relative(raw_path)
    with view_of(workspace) as view:
        found = view.lookup(rel)
        if found is None:
            raise NotFound(f"'{paths.show(rel)}' is not in workspace '{workspace.name}'", field="path")
        if found.kind != FILE or found.path is None:
            what = {DIR: "a directory", LINK: "a link"}.get(found.kind, "a special file")
            raise Conflict(f"'{paths.show(rel) or '/'}' in workspace '{workspace.name}' is {what}, not a file",
                           field="path")
        try:
            fd = open_regular(found.path)  # held open: the flat it is in may be swept once this block ends
        except NotRegular as exc:
            raise Conflict(f"'{paths.show(rel)}' changed while it was read; try again", field="path") from exc
    base = rel.rsplit("/", 1)[-1]
    guessed, _ = mimetypes.guess_type(base)
    return Download(fd, base, os.fstat(fd).st_size, guessed or "application/octet-stream")

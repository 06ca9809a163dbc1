"""A task's view over its stack: opening it, sealing it, and what happens to its layer at the end.

Order of locks, everywhere: the workspace lock, then at most one layer lock. ``open_view``
takes them one after the other, never nested the other way round.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, QuerySet
from django.utils import timezone

from boxsite.core.errors import Conflict
from tasks import sandbox, sql
from tasks.events import record_event
from tasks.layers import compaction, disk, disk_image, mounts, paths, review
from tasks.layers.base import driver_name, get_driver
from tasks.layers.diff import Change
from tasks.layers.driver import Root
from tasks.layers.locks import drop_layer_lock, layer_lock, workspace_lock
from tasks.layers.roots import changes_of, roots_for, tree_for
from tasks.layers.stack_record import current_stack, layer_task_ids, record_layer, write_seal
from tasks.layers.tree import DIR, LayerTree, Meta, NativeMarkers, apply_layer
from tasks.models import EventKind, Layer, LayerState, Task, Workspace
from tasks.sandbox import users
from tasks.states import ACTIVE, State

log = logging.getLogger(__name__)

REOPENED = ".reopened"  # a retried copy-driver task's layer, until it is laid over its new view


# --- opening ---------------------------------------------------------------------------------

def open_view(task: Task) -> Path:
    """The directory ``task`` works in, over the stack it recorded at its first start. A retried
    task's sealed layer is reopened first (``_reopen``): its view shows what its earlier runs wrote."""
    layer = record_layer(task)
    driver = get_driver(layer.driver)
    if not task.folders:
        seal_stack(task.workspace, list(task.layers), driver.markers)
    held = _reopen(task, layer)
    disk_mb = _open_disk(task, layer)
    roots = roots_for(task, layer, for_mount=True)
    with layer_lock(task.pk):
        state = sql.task_state(task.pk)
        if state not in ACTIVE:
            raise Conflict(f"the task is {state}; its view is not opened again", field="state")
        paths.private_dir(paths.layer_dir(task.pk))
        if task.folders:
            review.record_start(task, roots)
        if any(root.name for root in roots):  # several folders side by side in one view
            paths.view_dir(task.pk).mkdir(parents=True, exist_ok=True)
        owner = _sandbox_owner(task)
        for root in roots:
            driver.open(root, owner)
        _lay_back(task.pk, roots)
        if disk_mb is not None:
            if driver.name == "copy":  # the working copy is in the image: show it where the task works
                own = disk.mount_point(task.pk) / "view"
                own.mkdir(exist_ok=True)
                disk.bind(own, paths.view_dir(task.pk))
            disk.reserve(task.pk, disk_mb, used_bytes=held)
        # No meta is written here: the seal writes the first one (durably). Until then an absent
        # meta reads as an unsealed layer, the driver is the layer row's, and a later start tells
        # an opened layer by its upper directory or image (``_open_disk``). A meta saved here,
        # with its ``fsync``, would be the start's largest wait on a quiet disk.
    return paths.view_dir(task.pk)


def _open_disk(task: Task, layer: Layer) -> int | None:
    """The task's disk limit in MB when its writes go to an image of their own
    (``tasks.layers.disk``): made at its first start, mounted again at a later one. None when
    the task has no limit, or its layer was begun without one (it stays as it began)."""
    limit = task.limit("disk_mb")
    if limit is None or not sandbox.available():
        return None
    if disk.limited(task.pk):
        disk.mounted(task.pk)
        return limit
    directory = paths.layer_dir(task.pk)
    if (directory / "upper").exists() or Meta.load(directory).driver:
        return None  # opened before, without an image (both drivers make the upper at opening)
    content = (0, 0)
    if layer.driver == "copy":  # the working copy goes into the image too
        with compaction.read_trees(task.workspace, list(task.layers)) as lowers:
            content = disk_image.content_size([tree.root for root in roots_for(task, layer, for_mount=False, layers=lowers)
                                         for tree in root.lowers])
    paths.private_dir(directory)
    with layer_lock(task.pk):
        disk.create(task.pk, limit, content_bytes=content[0], content_files=content[1])
    return limit


def _reopen(task: Task, layer: Layer) -> int:
    """A retried task's layer was sealed when it failed: make it writable again, once. Returns
    the bytes it already holds, which count against a disk limit (0 when nothing was reopened).

    Overlay: the sealed upper is a valid upper again (the seal only dropped unchanged copy-ups and
    rewrote opaque directories as whiteouts). Copy: the layer is set aside (``REOPENED``); the
    driver materialises the view from the stack as at the first start (so its manifest, and the
    next seal, compare against the stack, not against the earlier run's files), and ``_lay_back``
    lays the set-aside layer over it. With a disk limit, a new image is made at the limit now in
    force (a retry may have raised it) and the overlay upper moves into it."""
    directory = paths.layer_dir(task.pk)
    with layer_lock(task.pk):
        meta = Meta.load(directory)
        if meta.sealing:
            # a copy seal cut short that the retry's release could not finish: a view made now
            # would be taken for the working copy its journal names
            raise Conflict("the task's layer was not sealed completely when it failed; its release "
                           "finishes that, then the task can be retried", field="state")
        if not meta.sealed:
            return 0
        upper = directory / "upper"
        upper.mkdir(exist_ok=True)
        held_bytes, held_files = disk_image.content_size([upper])
        limit = task.limit("disk_mb") if sandbox.available() and disk.unavailable() is None else None
        if layer.driver == "copy":
            aside = directory / REOPENED
            if not (aside / "upper").exists():
                aside.mkdir(exist_ok=True)
                Meta(format=meta.format, deleted=set(meta.deleted), opaque=set(meta.opaque)).save(aside)
                os.rename(upper, aside / "upper")
                upper.mkdir()
            meta.deleted, meta.opaque = set(), set()
            if limit is not None:
                with compaction.read_trees(task.workspace, list(task.layers)) as lowers:
                    trees = [tree.root for root in roots_for(task, layer, for_mount=False, layers=lowers) for tree in root.lowers]
                    content = disk_image.content_size([*trees, aside / "upper"])
                disk.create(task.pk, limit, content_bytes=content[0], content_files=content[1])
        elif limit is not None:
            point = disk.create(task.pk, limit, content_bytes=held_bytes, content_files=held_files)
            if not (point / "upper").exists():
                partial = point / ".upper.reopening"
                shutil.rmtree(partial, ignore_errors=True)
                subprocess.run(["cp", "-a", "--sparse=always", f"{upper}/.", str(partial)], check=True, capture_output=True)
                os.rename(partial, point / "upper")
            shutil.rmtree(upper)
        meta.sealed = False
        meta.save(directory)
        # on_retry cleared it with the move; a seal that read the task ended just before the
        # retry (its check, then its update) may have set it again since
        Layer.objects.filter(pk=layer.pk).update(sealed=False)
    log.info("reopened the sealed layer of retried task %s (%d bytes)", task.pk, held_bytes)
    return held_bytes


def _lay_back(task_id: str, roots: list[Root]) -> None:
    """Call under the layer lock, after the driver opened the view: a copy layer ``_reopen`` set
    aside goes back over the view, where the task's next seal finds it as its own changes."""
    aside = paths.layer_dir(task_id) / REOPENED
    if not aside.is_dir():
        return
    meta = Meta.load(aside)
    for root in roots:
        apply_layer(tree_for(aside, meta, root.name), root.view, None, share=False)
    shutil.rmtree(aside)


def _restore_set_aside(directory: Path, meta: Meta, roots: list[Root]) -> None:
    """A seal of a copy layer whose reopening did not finish (its run never got past opening
    the view): the set-aside layer is the task's layer again, and the bare view is dropped."""
    aside = directory / REOPENED
    if not aside.is_dir():
        return
    for root in roots:
        shutil.rmtree(root.view, ignore_errors=True)
    # Each step can be cut short by a crash and done again: the kept upper is moved back unless
    # it is already back, and its markers saved before their set-aside copy is removed.
    if (aside / "upper").is_dir():
        shutil.rmtree(directory / "upper", ignore_errors=True)
        os.rename(aside / "upper", directory / "upper")
    if (aside / "meta.json").exists():
        kept = Meta.load(aside)
        meta.deleted, meta.opaque = kept.deleted, kept.opaque
        meta.save(directory, sync_dir=True)
    shutil.rmtree(aside)


def _sandbox_owner(task: Task) -> tuple[int, int] | None:
    """The task's own user when it runs sandboxed (``lifecycle.prepare`` created it first)."""

    if not sandbox.available():
        return None

    ident = users.find_user(task.pk)
    return (ident.uid, ident.gid) if ident is not None else None


# --- sealing and ending ----------------------------------------------------------------------

def seal_stack(workspace: Workspace, newest_first: list[str], markers: str, *, flat_only: bool = False) -> None:
    """Before a stack is mounted or compacted: seal the layers it stacks on their own (in
    ``markers``: overlayfs stacks native ones only) and those a missing flat is built from
    (``compaction.to_seal``). The rest are in a cached flat and long sealed: the work is bounded
    by the compaction depth, not by the number of done tasks. ``flat_only``: only those the flat
    is built from (a refresh that builds it mounts nothing)."""
    own, _ = compaction.split(newest_first, markers)
    for task_id in compaction.to_seal(workspace, newest_first, markers):
        if flat_only and task_id in own:
            continue
        native = markers == "native" and task_id in own
        key = (str(paths.layer_dir(task_id)), native)
        if key in _stacked_final:
            continue
        seal_layer(task_id, native=native)
        if _is_final(Meta.load(paths.layer_dir(task_id)), native):
            if len(_stacked_final) >= _STACKED_FINAL_MAX:
                _stacked_final.clear()
            _stacked_final.add(key)


# Layers of a stack this process found final (by directory, and whether overlayfs needs them
# native): not looked at again by later starts and releases. A layer in a stack is a done task's,
# and stays final: only a failed task's own layer is ever reopened (``_reopen``), and a failed
# layer joins no stack. Its undo deletes it, which no start then looks for. So only
# ``seal_stack`` reads this, never ``seal_layer`` itself (a failed task's release seals again).
_STACKED_FINAL_MAX = 8192
_stacked_final: set[tuple[str, bool]] = set()


def _to_native(directory: Path, meta: Meta) -> None:
    """Rewrite a portable layer's markers as whiteouts and xattrs so overlayfs can stack it."""

    writer = NativeMarkers()
    upper = directory / "upper"
    for rel in sorted(meta.deleted):
        (upper / rel).parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(upper / rel):
            writer.whiteout(upper, rel)
    for rel in sorted(meta.opaque):
        writer.opaque(upper, rel)
    meta.deleted, meta.opaque, meta.format = set(), set(), "native"
    meta.save(directory)


def seal_layer(task_id: str, *, native: bool = False, stopped: bool = False,
               rows: tuple[Task, Layer] | None = None) -> None:
    """Leave an ended task's layer final: view stopped, changes in the layer format. A no-op for
    an active task (it still writes), a sealed layer, or a deleted one. ``stopped``: the caller
    completed ``sandbox.stop`` for the task just before (the janitor). ``rows``: the task (as
    ``_task_of`` reads it) and its layer, read by the caller (``release``) just before; else
    they are read under the layer's lock."""
    directory = paths.layer_dir(task_id)
    if _is_final(Meta.load(directory), native):
        # Opening and refreshing seal every layer of a stack; most are long final. The meta is
        # replaced whole, and only once the seal (or conversion) completed: no lock needed to see it.
        return
    with layer_lock(task_id):
        if not directory.is_dir():
            return
        meta = Meta.load(directory)
        if not meta.sealed:
            if rows is None:
                task, layer = rows_of(task_id)
            else:  # read outside this lock: a retry may have made the task active again since
                task, layer = rows
                state = sql.task_state(task_id)
                if state is None or state in ACTIVE:
                    return  # gone, or active again
                task.state = state  # as it is now (undone meanwhile, say): the seal's notes read it
            if task is None or layer is None or task.state in ACTIVE:
                return
            roots, summary = seal_files(task, layer, meta, stopped=stopped)
            record_seal(task, layer, meta, roots, summary)
        if native and meta.format == "portable":
            _to_native(directory, meta)


def seal_files(task: Task, layer: Layer, meta: Meta, *, stopped: bool = False) -> tuple[list[Root], dict[str, Any]]:
    """The first half of a seal, on disk: ``task``'s view stopped and its changes left in the
    layer format in ``meta`` (not saved); its roots and its manifest. Call under the layer's
    lock, once the task's runs can write no more (it ended, or its worker's run finished its
    work and holds the lease: ``tasks.layers.sealer``). ``stopped``: ``sandbox.stop`` completed
    for the task just before (the janitor)."""
    task_id = task.pk
    # The task's release runs in the background (tasks.run.lifecycle's janitor). Its layer joins no
    # stack before its sandbox is stopped: its processes gone and every file its user owned
    # handed back, or a later task's id-mapped view would show them as nobody's. Idempotent: a
    # no-op when the janitor got there first. The rest of the sandbox's release (keyrings, the
    # user back to the pool) is not waited for here.
    if not stopped:
        sandbox.stop(task_id)
    driver = get_driver(layer.driver)
    if driver.name == "overlay" and disk.limited(task_id):
        # the upper leaves its image before the seal rewrites it (a full image has no room for
        # the whiteouts the seal writes)
        _unmount(task_id)
        disk.settle(task_id)
    with compaction.read_trees(task.workspace, list(task.layers)) as lowers:
        roots = roots_for(task, layer, for_mount=False, layers=lowers)
        _restore_set_aside(paths.layer_dir(task_id), meta, roots)
        for root in roots:
            driver.seal(root, meta)
        disk.settle(task_id)  # the copy driver's working copy was in the image: drop it
        meta.driver, meta.format, meta.sealed = driver.name, driver.markers, True
        return roots, summarise(changes_of(task, layer, roots, meta))


def record_seal(task: Task, layer: Layer, meta: Meta, roots: list[Root], summary: dict[str, Any]) -> None:
    """The second half of a seal (``seal_files`` made it): the layer's row, then its meta, saved
    sealed. Call under the layer's lock, with ``task`` ended (as it is now)."""
    # ``sealed`` lets a start whose task was created before this one finished keep the layer in
    # its stack (``_start_stack_condition``). It is set a moment before the meta says sealed: such
    # a start waits on this lock for that moment, as a start waits for any seal in progress.
    due = write_seal(task, layer, summary)
    if due and connection.in_atomic_block:
        # Sealed inside a caller's transaction (a dependency's check, say): the task's own
        # release may find the layer sealed before that commit shows it the flag, and write no
        # note. Whoever commits the flag writes the note too (once: the clear).
        transaction.on_commit(lambda: note_overrides(task, layer), robust=True)
    # The meta is saved sealed last: a reader that finds the layer sealed (and so skips sealing
    # it) finds its manifest written too. The override note is not: the task's release writes it
    # after this lock (``note_overrides``), so a start that stacks the layer does not wait for it;
    # ``note_due`` keeps it due across a crash.
    meta.save(paths.layer_dir(task.pk))
    if task.folders:
        review.record_touched(task, roots)  # reads the sealed layer (its lock is held here)


def record_lost_seal(task_id: str) -> None:
    """A layer sealed inside a caller's savepoint that was rolled back (a dependent's verdict
    read its artifact, then its decision was taken again with more locks): the meta on disk says
    sealed, but the row lost the seal's update (its manifest, ``note_due``, ``sealed``). Written
    again from the sealed layer; a no-op for a row that has them. Call where that savepoint may
    have been (``dependencies.artifact_present``)."""
    if not Meta.load(paths.layer_dir(task_id)).sealed:
        return
    with layer_lock(task_id):
        layer = next(iter(Layer.objects.filter(task_id=task_id, sealed=False)), None)
        task = _task_of(task_id) if layer is not None else None
        if task is None or layer is None or task.state in ACTIVE:
            return
        meta = Meta.load(paths.layer_dir(task_id))
        with compaction.read_trees(task.workspace, list(task.layers)) as lowers:
            roots = roots_for(task, layer, for_mount=False, layers=lowers)
            summary = summarise(changes_of(task, layer, roots, meta))
        write_seal(task, layer, summary)


def _task_of(task_id: str) -> Task | None:
    """The task with its workspace, or None when it is gone: a ``get``, where ``first()`` would
    order and slice the query too, for a row that is read at every release."""
    try:
        return Task.objects.select_related("workspace").only(*sql.SEALED_BY).get(pk=task_id)
    except Task.DoesNotExist:
        return None


def rows_of(task_id: str) -> tuple[Task | None, Layer | None]:
    """The task (as ``_task_of`` reads it) and its layer, in one statement written once per
    process (``sql.layer_with_task``); (None, None) when the layer is gone (a task has a layer
    from its first start on)."""
    found = sql.layer_with_task(task_id)
    if found is None:
        return None, None
    layer, task = found
    return task, layer


def _is_final(meta: Meta, native: bool) -> bool:
    return meta.sealed and not (native and meta.format == "portable")


def _applied_since_created(task: Task, layer: Layer) -> QuerySet[Layer]:
    """The layers that may be missing from ``task``'s view: applied before its own and since it
    was created. Those applied earlier were in the workspace when it recorded its stack, and a
    start leaves out only layers applied after its task's creation (``stack_record.record_layer``), so they
    are in it; ``_not_stacked`` leaves out the rest of the stack. The stack is never put in the query:
    a query naming each id of it would grow with the workspace's history, and the seal's work
    with it (docs/internals/decisions-performance.md#performance)."""
    # A final move takes its layer's ``applied_at`` before it commits, and a task created and
    # started meanwhile on PostgreSQL records its stack without that layer (not committed yet):
    # the bound leaves room for a final move's transaction, one lease long.
    since = task.created_at - timedelta(seconds=settings.BOX_LEASE_SECONDS)
    return Layer.objects.filter(workspace_id=task.workspace_id, state=LayerState.APPLIED, applied_at__gte=since,
                                applied_at__lt=layer.applied_at).exclude(task_id=task.pk)


Row = TypeVar("Row", bound=tuple[Any, ...])


def _not_stacked(task: Task, rows: list[Row]) -> list[Row]:
    """The rows (task id first) of layers not in ``task``'s stack: applied after its start, or
    left out of it while they sealed."""
    stacked = set(task.layers)
    return [row for row in rows if row[0] not in stacked]


def note_overrides(task: Task, layer: Layer, *, found_due: bool = False, read_due: bool | None = None) -> None:
    """Tasks that overlap on one workspace: the last to finish wins (docs/internals/decisions.md). When
    ``task`` finished over the layers of tasks that ended after it was created and are not in its
    view, its log says which of their paths its own layer now replaces or hides, so nothing is
    overridden silently.

    Call after the layer's seal, outside its lock: the seal left the note due (``note_due``), and
    the note's event clears it in its transaction, so of two writers (the release, reconcile)
    one writes it. ``found_due``: start-up reconcile read it due; it is cleared even when nothing
    is left to note (the task undone since, say). A layer noted whose seal is not complete (its
    start left it out unsealed, and its release has not got there) is sealed first: its paths
    are its seal's manifest. ``read_due``: the layer's ``note_due`` as read after its seal (None: it
    is read here); a stale True costs only the look for the layers noted, which reads it again."""
    overridden: dict[str, list[str]] = {}
    if not found_due and not (read_due if read_due is not None else Layer.objects.filter(pk=layer.pk, note_due=True).exists()):
        return  # the seal found every layer applied before this one in its view (nearly always)
    if not task.folders and task.state == State.DONE and layer.applied_at is not None:
        due = Exists(Layer.objects.filter(pk=layer.pk, note_due=True))
        others = _not_stacked(task, list(_applied_since_created(task, layer).filter(due).order_by("applied_at")
                                         .values_list("task_id", "manifest", "sealed")))
        if not others and not found_due:
            return  # no note due: no task it did not see ended before it, or its note is written
        tree = LayerTree.of_layer(paths.layer_dir(task.pk))
        for other_id, manifest, sealed in others:
            if not sealed:
                try:
                    seal_layer(other_id)  # no layer lock is held here: this one's is taken alone
                except Exception:  # noqa: BLE001 - the note waits for that seal; this release goes on
                    log.warning("the override note of task %s waits for the seal of task %s's layer; it stays due",
                                task.pk, other_id, exc_info=True)
                    return
                manifest = next(iter(Layer.objects.filter(task_id=other_id).values_list("manifest", flat=True)), None)
            listed = (manifest or {}).get("paths", [])
            hit = [item["path"] for item in listed if _covers(tree, paths.unshow(item["path"]))]
            if hit:
                overridden[other_id] = hit
    elif not found_due:
        return
    with transaction.atomic():
        if overridden:  # the event first: it takes the task's row, then the flag its layer's (as a final move does)
            shown = "; ".join(f"{', '.join(hit[:5])}{' …' if len(hit) > 5 else ''} from task {other_id}"
                              for other_id, hit in overridden.items())
            record_event(task, EventKind.NOTE,
                         f"finished after tasks that ended after it was created (their work was not in its view); "
                         f"the last to finish wins, so this task's "
                         f"version stands at {shown}", {"overrides": overridden})
        if not Layer.objects.filter(pk=layer.pk, note_due=True).update(note_due=False):
            transaction.set_rollback(True)  # another writer cleared it first (its commit waited for): it wrote the note


def write_due_notes() -> None:
    """Start-up reconcile, after the releases, and the scheduler hourly: the override notes a
    crash left due after their layer's seal (``note_overrides``). A layer not sealed yet is
    skipped: its seal is still to come, and its release writes the note."""
    for layer in Layer.objects.filter(note_due=True):
        task = _task_of(layer.task_id)
        if task is None or (task.state == State.DONE and not Meta.load(paths.layer_dir(task.pk)).sealed):
            continue
        try:
            note_overrides(task, layer, found_due=True)
        except Exception:  # noqa: BLE001 - one layer's fault leaves the others' notes to be written
            log.exception("the override note of task %s could not be written; it stays due", task.pk)


def _covers(tree: LayerTree, rel: str) -> bool:
    """``tree`` has an entry at ``rel`` (a file, link or deletion) or a file or deletion above it."""
    entry = tree.entry(rel)
    if entry is not None and entry.kind != DIR:
        return True
    above = paths.parent_of(rel)
    while above:
        entry = tree.entry(above)
        if entry is not None and entry.kind != DIR:
            return True
        above = paths.parent_of(above)
    return False


def summarise(changes: list[Change], limit: int = 500) -> dict[str, Any]:
    return {
        "changed": len(changes),
        "paths": [{"path": paths.show(c.path), "kind": c.kind} for c in changes[:limit]],
        "more": max(0, len(changes) - limit),
    }


def _unmount(task_id: str) -> None:
    mounts.unmount_all_under(*paths.mount_roots(task_id))  # the view first: it sits on the lower mounts


def _remove_view(task_id: str) -> None:
    if mounts.mounts_under(*paths.mount_roots(task_id)):
        log.error("task %s still has mounts after unmounting; its view is left in place", task_id)
        return
    for leftover in (paths.view_dir(task_id), paths.lower_mounts_dir(task_id)):
        if leftover.exists():
            shutil.rmtree(leftover)
    for leftover in paths.task_dir(task_id).glob(".view.copying"):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        paths.task_dir(task_id).rmdir()  # only if the sandbox left nothing of its own there
    except OSError:
        pass


def release(task_id: str, *, stopped: bool = False, rows: tuple[Task | None, Layer | None] | None = None) -> None:
    """After ``task_id`` ended (or at start-up): unmount, seal, note, settle its layer. Idempotent.
    ``stopped``: ``sandbox.stop`` completed for the task just before. ``rows``: ``rows_of(task_id)``,
    read by the caller (``lifecycle.release``) under its hold on the task."""
    if rows is None:
        task, layer = rows_of(task_id)
    else:
        task, layer = rows
        if task is not None:  # read before the sandbox's stop: a retry may have made it active since
            task.state = sql.task_state(task_id) or task.state
    if task is None:  # no layer: the task is gone, or never opened a view
        task = _task_of(task_id)
    if task is not None and task.state in ACTIVE:
        log.warning("release(%s) called while the task is %s; its view is left alone", task_id, task.state)
        return
    _unmount(task_id)  # always, whatever else fails below
    if task is None:
        disk.unmount(task_id)
        _remove_view(task_id)
        return
    if layer is not None:
        # A row read sealed has its ``note_due`` as the seal wrote it (only a note clears it later).
        read_due = layer.note_due if layer.sealed else None
        seal_layer(task_id, stopped=stopped, rows=(task, layer))
        note_overrides(task, layer, read_due=read_due)  # after the seal and its lock, whoever sealed the layer
    _remove_view(task_id)
    if task.folders:
        if task.state == State.UNDONE:
            delete_layer(task_id)
        return
    refresh_workspace(task.workspace)


def delete_layer(task_id: str) -> None:
    with layer_lock(task_id):
        _unmount(task_id)
        disk.unmount(task_id)
        shutil.rmtree(paths.layer_dir(task_id), ignore_errors=True)
    drop_layer_lock(task_id)


def refresh_workspace(workspace: Workspace) -> None:
    """After a layer joined or left: build the flats the next task needs, and delete undone
    layers and flats that no active task reads any more. The flats are built before the workspace
    lock is taken (``ensure_flat`` needs none), and the lock only when there may be something to
    delete: the starts take it to record their stacks."""
    stack = current_stack(workspace)
    markers = get_driver(driver_name()).markers
    # Only what the flats are built from: a layer stacked on its own is sealed by its own release
    # (or by a start that stacks it), and sealing it here made one janitor wait on the lock of
    # another's seal in progress, for nothing, in every burst.
    seal_stack(workspace, stack, markers, flat_only=True)
    _, flats = compaction.split(stack, markers)
    for flat in flats:
        compaction.ensure_flat(workspace, flat.layers, markers)
    if not compaction.sweep_wanted(workspace, {flat.key for flat in flats}) and not any(
            paths.layer_dir(task_id).exists() for task_id in layer_task_ids(workspace.pk, LayerState.DISCARDED, newest_first=False)):
        return  # nothing a sweep could delete; one that appears later is a later refresh's
    with workspace_lock(workspace.pk):
        active = list(Task.objects.filter(workspace=workspace, folders=[], state__in=ACTIVE).values_list("pk", "layers"))
        readers = {layer_id for _, layers in active for layer_id in layers}
        layer_rows = dict(Layer.objects.filter(task_id__in=[pk for pk, _ in active]).values_list("task_id", "driver"))
        keep: set[str] = set()
        for flat in flats:
            compaction.ensure_flat(workspace, flat.layers, markers)  # again: a sweep may have taken it since
            keep.add(flat.key)
        # The stack read before the lock may be stale by now (a layer joined or left since):
        # the next start's flats are the current stack's, so they are kept too (built by that start).
        keep |= {flat.key for flat in compaction.split(current_stack(workspace), markers)[1]}
        for pk, layers in active:
            if pk in layer_rows:
                keep |= compaction.mounted_keys(list(layers), get_driver(layer_rows[pk]).markers)
        compaction.sweep_flats(workspace, keep)
        for task_id in layer_task_ids(workspace.pk, LayerState.DISCARDED, newest_first=False):
            if task_id not in readers and paths.layer_dir(task_id).exists():
                delete_layer(task_id)


# --- the layer follows the task's state ------------------------------------------------------

def on_retry(task: Task) -> None:
    """Inside the transaction that sent a failed task back to the queue: its layer is active
    again (the next ``open_view`` reopens its files)."""
    Layer.objects.filter(task=task).update(state=LayerState.ACTIVE, sealed=False)


def on_final_move(task: Task, new_state: str) -> None:
    """Inside the transaction that moved ``task`` to a final state: the layer joins the
    workspace (done), stays apart (failed, cancelled) or leaves it (undone). Files are settled
    after commit by ``release``."""
    layer = Layer.objects.filter(task=task)
    if new_state == State.DONE:
        if task.folders:
            return  # stays active until the owner keeps or undoes it
        layer.update(state=LayerState.APPLIED, applied_at=timezone.now())
    elif new_state in (State.FAILED, State.CANCELLED):
        layer.update(state=LayerState.FAILED)
    elif new_state == State.UNDONE:
        layer.update(state=LayerState.DISCARDED)

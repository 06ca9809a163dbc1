"""Taking a backup while the box runs, and restoring one into an empty box.

The order makes the copy consistent with the database: the tasks that have ended are read
first, then the database snapshot is taken, then the files are copied. Every task that ended
before the snapshot is final in it, and its layer no longer changes but by the owner's verbs
and the retention sweep, which take the layer's lock: the backup holds that lock while it copies
the layer (and a workspace's lock while it copies its compacted layers, which are swept under it). A task still active at the snapshot comes back as after a crash of the box at that
moment: its layer is copied as it stands while the copy passes (a disk-limited task's changes
so far stay in its image and are not copied), and the restored box's recovery runs it again.
"""
from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from boxsite.backups import archive, database, datadir
from boxsite.core import beats
from tasks.layers.locks import layer_lock, workspace_lock
from tasks.models import Task
from tasks.states import FINAL
from tasks.vault import crypto

log = logging.getLogger("box.backup")

# What a data directory the box has only started in holds: it is still empty for a restore.
MADE_AT_START = frozenset({"django-secret-key"})


class RestoreRefused(Exception):
    pass


@dataclass(frozen=True)
class BackupTaken:
    path: Path
    layers: int
    active_layers: int
    skipped: int


@dataclass(frozen=True)
class Restored:
    manifest: archive.Manifest
    attributes_missed: int


def _migrations() -> dict[str, str]:
    latest: dict[str, str] = {}
    for app, name in MigrationRecorder.Migration.objects.order_by("app", "name").values_list("app", "name"):
        latest[app] = name
    return latest


def take_backup(output: Path) -> BackupTaken:
    data = Path(settings.BOX_DATA_DIR)
    ended = set(Task.objects.filter(state__in=FINAL).values_list("pk", flat=True))
    migrations = _migrations()
    writer = archive.Writer(output)
    try:
        with tempfile.TemporaryDirectory(dir=output.parent, prefix=".box-backup-") as scratch:
            snapshot = Path(scratch) / "database"
            database.snapshot(snapshot)
            kind = database.kind()
            manifest = archive.Manifest(
                created_at=archive.now(), database=kind, database_member=database.MEMBERS[kind],
                database_sha256=archive.digest_of(snapshot),
                vault_key="environment" if crypto.keys_are_configured() else "file", migrations=migrations)
            writer.add_bytes(archive.MANIFEST, manifest.as_json())
            writer.add_file(manifest.database_member, snapshot)
        writer.add_path(archive.DATA, data)
        for top in datadir.top_level(data):
            writer.add_tree(datadir.walk(top), data)
        # A workspace's flats are swept under its lock; one being built (a dot) is not whole yet.
        writer.add_path(f"{archive.DATA}/flats", data / "flats")
        for workspace_id, path in datadir.flats(data):
            with workspace_lock(workspace_id):
                writer.add_tree(datadir.walk(path, skip_in_top=frozenset({"."})), data)
        writer.add_path(f"{archive.DATA}/layers", data / "layers")
        count = active = 0
        for layer in datadir.layers(data):
            tree = datadir.walk(layer.path, skip_in_top=datadir.LAYER_RUNNING_STATE)
            if layer.task_id in ended:
                with layer_lock(layer.task_id):
                    writer.add_tree(tree, data)
            else:
                writer.add_tree(tree, data)
                active += 1
            count += 1
        writer.close()
    except BaseException:
        writer.abandon()
        raise
    return BackupTaken(output, count, active, writer.skipped)


def _is_empty(data: Path) -> bool:
    skip = {path.name for path in datadir.database_files()}
    return all(entry.name in MADE_AT_START or entry.name in skip for entry in os.scandir(data))


def restore_backup(path: Path, *, force: bool) -> Restored:
    reader = archive.Reader(path)
    try:
        manifest = reader.manifest
        if manifest.database != database.kind():
            raise RestoreRefused(f"the backup holds a {manifest.database} database and this box is configured for "
                                 f"{database.kind()}: set DATABASE_URL (PostgreSQL) or unset it (SQLite) to match")
        data = Path(settings.BOX_DATA_DIR)
        if not force:
            if not _is_empty(data):
                raise RestoreRefused(f"the data directory {data} is not empty: restore into a new one (set BOX_DATA_DIR), "
                                     "or pass --force to restore over it")
            if not database.is_empty():
                raise RestoreRefused("the configured database already has tables: restore into a new database, "
                                     "or pass --force to replace it")
        alive = [role for role in beats.ROLES if beats.liveness(role)["state"] == "alive"]
        if alive:
            raise RestoreRefused(f"the box's {' and '.join(alive)} on this data directory is running: stop the box first")
        with tempfile.TemporaryDirectory(dir=data, prefix=".box-restore-") as scratch:
            snapshot = Path(scratch) / "database"
            reader.extract_database(snapshot)
            missed = reader.extract_data(data)
            database.restore(snapshot, replace=force)
    finally:
        reader.close()
    connection.close()
    # A backup of an older box is brought up to this one's tables.
    call_command("migrate", interactive=False, verbosity=0)
    return Restored(manifest, missed)

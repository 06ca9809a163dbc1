"""The database's part of a backup: a consistent snapshot taken while the box runs, and its
restore into an empty database.

SQLite: the online backup API copies the database as one read transaction sees it (WAL mode lets
the box's writers go on meanwhile). PostgreSQL: ``pg_dump`` reads everything in one
repeatable-read transaction, and ``pg_restore`` puts it back in one transaction.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from boxsite.core import sql

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
MEMBERS = {SQLITE: "database/box.sqlite3", POSTGRESQL: "database/box.pgdump"}


class DatabaseError(Exception):
    pass


def kind() -> str:
    return POSTGRESQL if settings.DB_IS_POSTGRES else SQLITE


def sqlite_path() -> Path:
    return Path(settings.DATABASES["default"]["NAME"])


def snapshot(into: Path) -> None:
    """Write the database as it is at one instant to ``into``."""
    if kind() == SQLITE:
        source = sqlite3.connect(f"file:{sqlite_path()}?mode=ro", uri=True,
                                 timeout=float(settings.DATABASES["default"]["OPTIONS"].get("timeout", 20.0)))
        target = sqlite3.connect(into)
        try:
            source.backup(target)  # all pages in one step: one read transaction, one instant
        finally:
            target.close()
            source.close()
        return
    _run(["pg_dump", "--format=custom", "--no-owner", "--no-privileges", f"--file={into}"], "pg_dump")


def is_empty() -> bool:
    """No table of the box's (or anyone's) in the configured database."""
    if kind() == SQLITE:
        path = sqlite_path()
        return not path.exists() or path.stat().st_size == 0
    return sql.tables_in_schema() == 0


def restore(snapshot_file: Path, *, replace: bool) -> None:
    """Put ``snapshot_file`` in place of the configured database; ``replace``: over what is there."""
    connection.close()
    if kind() == SQLITE:
        path = sqlite_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            if replace:
                stale.unlink(missing_ok=True)
        partial = path.with_name(f".{path.name}.restoring")
        source, target = sqlite3.connect(snapshot_file), sqlite3.connect(partial)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        os.chmod(partial, 0o600)
        os.replace(partial, path)
        return
    argv = ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction"]
    if replace:
        argv += ["--clean", "--if-exists"]
    _run([*argv, f"--dbname={_pg_dbname()}", str(snapshot_file)], "pg_restore")


def _pg_dbname() -> str:
    return str(settings.DATABASES["default"]["NAME"])


def _pg_env() -> dict[str, str]:
    """libpq's own variables for the configured database, so no password is on a command line."""
    db: dict[str, Any] = dict(settings.DATABASES["default"])
    env = dict(os.environ)
    for key, name in (("HOST", "PGHOST"), ("PORT", "PGPORT"), ("USER", "PGUSER"), ("PASSWORD", "PGPASSWORD")):
        if db.get(key):
            env[name] = str(db[key])
    env["PGDATABASE"] = _pg_dbname()
    for option, name in (("sslmode", "PGSSLMODE"), ("options", "PGOPTIONS")):
        if db.get("OPTIONS", {}).get(option):
            env[name] = str(db["OPTIONS"][option])
    return env


def _run(argv: list[str], tool: str) -> None:
    try:
        done = subprocess.run(argv, env=_pg_env(), capture_output=True, text=True)
    except FileNotFoundError:
        raise DatabaseError(f"{tool} is not installed: install PostgreSQL's client tools "
                            "(Debian: postgresql-client) in the version of the server") from None
    if done.returncode != 0:
        raise DatabaseError(f"{tool} failed: {done.stderr.strip() or f'exit code {done.returncode}'}")

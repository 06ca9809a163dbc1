"""manage.py backup: the database, the data directory and the vault key in one tar file,
taken while the box runs (docs/guide/backups.md)."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from boxsite.backups.archive import Unreadable
from boxsite.backups.database import DatabaseError
from boxsite.backups.services import take_backup


class Command(BaseCommand):
    help = "Write a backup of the box (database, data directory, vault key) to one tar file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-o", "--output", help="the archive to write (default: box-backup-<UTC time>.tar here)")

    def handle(self, *args: Any, **options: Any) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        output = Path(options["output"] or f"box-backup-{stamp}.tar").absolute()
        if output.exists():
            raise CommandError(f"{output} exists: name another file with --output")
        if not output.parent.is_dir():
            raise CommandError(f"{output.parent} is not a directory")
        try:
            taken = take_backup(output)
        except (DatabaseError, Unreadable) as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"the backup could not be written: {exc}") from None
        self.stdout.write(f"backup written to {taken.path} ({taken.path.stat().st_size // 1024} KiB): "
                          f"{taken.layers} task layer(s), {taken.active_layers} of a task still active (copied as it stood)")
        if taken.skipped:
            self.stderr.write(f"{taken.skipped} file(s) could not be read by this user and are not in the backup: "
                              "run backup as the user the box runs as")

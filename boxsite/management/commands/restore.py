"""manage.py restore: a backup put back into a new data directory and database (docs/guide/backups.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from boxsite.backups.archive import ArchiveError
from boxsite.backups.database import DatabaseError
from boxsite.backups.services import RestoreRefused, restore_backup


class Command(BaseCommand):
    help = "Restore a backup written by 'manage.py backup' into an empty data directory and database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("archive", help="the backup's .tar file")
        parser.add_argument("--force", action="store_true",
                            help="restore over a data directory and database that are not empty")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            restored = restore_backup(Path(options["archive"]), force=options["force"])
        except ArchiveError as exc:
            raise CommandError(f"not restored: {exc}") from None
        except (RestoreRefused, DatabaseError) as exc:
            raise CommandError(f"not restored: {exc}") from None
        manifest = restored.manifest
        self.stdout.write(f"restored the backup of {manifest.created_at} ({manifest.database} database)")
        if manifest.vault_key == "environment":
            self.stdout.write("the vault's key came from BOX_SECRET_KEY and is not in the backup: "
                              "set BOX_SECRET_KEY to the same key(s) before the box starts")
        if restored.attributes_missed:
            self.stderr.write(f"{restored.attributes_missed} extended attribute(s) could not be set (restore as root "
                              "to keep the layers' overlay attributes)")

"""Re-encrypt every vault secret under the first key, and manage the generated key file."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks.vault import crypto
from tasks.vault import store as vault


class Command(BaseCommand):
    help = ("Re-encrypt every vault secret under the first vault key. With a generated key file: "
            "--generate puts a fresh key first before re-encrypting; --retire drops the old keys "
            "once every secret is on the first key.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--generate", action="store_true", help="put a fresh key first in the generated key file")
        parser.add_argument("--retire", action="store_true", help="drop every key but the first, after re-encrypting")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["generate"]:
                crypto.prepend_generated_key()
                self.stdout.write("a new vault key is now first; the old keys still decrypt")
            count = vault.rotate()
            self.stdout.write(f"re-encrypted {count} secret(s) under the first key")
            if options["retire"]:
                left = vault.rows_on_old_keys()
                if left:
                    raise CommandError(f"not retiring: {len(left)} secret(s) are still on old keys: {', '.join(left)}")
                if crypto.keys_are_configured():
                    self.stdout.write("every secret is on the first key: now remove the old keys from BOX_SECRET_KEY")
                else:
                    dropped = crypto.retire_old_generated_keys()
                    self.stdout.write(f"dropped {dropped} old key(s)")
        except crypto.VaultKeyError as exc:
            raise CommandError(str(exc)) from exc

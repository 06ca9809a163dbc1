from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from boxsite.doctor import run_checks


class Command(BaseCommand):
    help = "Check what this machine gives the box (sandbox, database, Redis, data dir, Chromium, model); " \
           "each failure with its fix. Exits 1 when a required check fails."
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        checks = run_checks()
        for check in checks:
            mark = "ok  " if check.ok else ("FAIL" if check.required else "warn")
            self.stdout.write(f"{mark} {check.name}: {check.detail}")
            if not check.ok:
                self.stdout.write(f"     fix: {check.fix}")
        failed = [check.name for check in checks if check.required and not check.ok]
        if failed:
            raise CommandError(f"required checks failed: {', '.join(failed)}")
        self.stdout.write("every required check passed")

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from boxsite.core.auth import issue_api_token


class Command(BaseCommand):
    help = "Create an API token for the owner and print it once on stdout."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", help="owner username (default: the only owner)")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--folders", action="store_true", help="allow this token to hand out the owner's folders")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        owners = User.objects.filter(is_superuser=True, is_active=True)
        if options["user"]:
            owners = owners.filter(username=options["user"])
        if owners.count() != 1:
            raise CommandError("name the owner with --user" if owners.exists() else "no owner yet: run 'manage.py createowner NAME' first")
        _, raw = issue_api_token(owners.get(), options["name"], can_use_folders=options["folders"])
        self.stdout.write(raw)

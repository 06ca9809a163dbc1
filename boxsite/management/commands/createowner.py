from __future__ import annotations

import getpass
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Create the box's owner account. Non-interactive with BOX_OWNER_PASSWORD set."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        username = options["username"]
        if User.objects.filter(username=username).exists():
            raise CommandError(f"a user named {username!r} already exists")
        password = os.environ.get("BOX_OWNER_PASSWORD")
        if not password:
            if not os.isatty(0):
                raise CommandError("set BOX_OWNER_PASSWORD, or run this in a terminal to be asked")
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("the passwords differ")
        if len(password) < 8:
            raise CommandError("the password must be at least 8 characters")
        User.objects.create_superuser(username=username, password=password, email="")
        self.stdout.write(f"owner {username!r} created")

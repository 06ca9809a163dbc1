"""Create the box's one owner, or (``--change-password``) change the owner's password.

Non-interactive with ``BOX_OWNER_PASSWORD`` set. The password rule is the setup page's.
"""
from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from boxsite import services
from boxsite.core.errors import NotFound


class Command(BaseCommand):
    help = ("Create the box's owner account (a box has one), or change its password with "
            "--change-password. Non-interactive with BOX_OWNER_PASSWORD set.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--change-password", action="store_true",
                            help="change the existing owner's password instead of creating an owner")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username or len(username) > services.MAX_USERNAME:
            raise CommandError(f"the name must be 1 to {services.MAX_USERNAME} characters")
        owner = services.current_owner()
        if not options["change_password"] and owner is not None:
            raise CommandError(f"this box already has an owner ({owner.get_username()!r}); a box has one owner. "
                               f"To change its password: createowner {owner.get_username()} --change-password")
        password = self._password()
        problem = services.owner_password_problem(password)
        if problem:
            raise CommandError(f"the password is too weak: {problem}")
        if options["change_password"]:
            try:
                services.set_owner_password(username, password)
            except NotFound as exc:
                raise CommandError(exc.message) from exc
            self.stdout.write(f"the password of owner {username!r} is changed")
            return
        try:
            services.create_owner(username, password)
        except services.OwnerExists as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"owner {username!r} created")

    def _password(self) -> str:
        password = os.environ.get("BOX_OWNER_PASSWORD")
        if password:
            return password
        if not os.isatty(0):
            raise CommandError("set BOX_OWNER_PASSWORD, or run this in a terminal to be asked")
        password = getpass.getpass("Password: ")
        if password != getpass.getpass("Password (again): "):
            raise CommandError("the passwords differ")
        return password

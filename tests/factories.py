from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth import get_user_model

_counter = itertools.count(1)


def make_owner(username: str | None = None, password: str = "a-long-password") -> Any:
    User = get_user_model()
    return User.objects.create_superuser(username=username or f"owner{next(_counter)}", password=password, email="")


def flow(*steps: dict[str, Any], **vars: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"steps": list(steps)}
    if vars:
        body["vars"] = vars
    return body

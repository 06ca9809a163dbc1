"""What one machine answers another (``/internal/machine/``): only a call signed with the box's
shared secret, and always in the API's error shape."""
from __future__ import annotations

from typing import Any

from django.test import Client

from tasks.machines import calls
from tests.conftest import Box

SECRET = "s" * 40


def _get(path: str, signature: str | None) -> Any:
    headers = {calls.HEADER: signature} if signature is not None else {}
    return Client().get(path, headers=headers)


def test_an_unsigned_or_wrongly_signed_call_is_refused_and_a_signed_one_answered(box: Box, settings: Any) -> None:
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "a", SECRET
    path = "/internal/machine/tasks/tknosuchtask/diff"
    assert _get(path, None).status_code == 403
    assert _get(path, "1.abc").json()["code"] == "FORBIDDEN"
    settings.BOX_MACHINE_SECRET = "t" * 40
    wrong = calls.sign("GET", path)
    settings.BOX_MACHINE_SECRET = SECRET
    assert _get(path, wrong).status_code == 403
    answered = _get(path, calls.sign("GET", path))
    assert answered.status_code == 404 and answered.json()["code"] == "NOT_FOUND"


def test_one_machine_answers_no_machine_call(box: Box, settings: Any) -> None:
    settings.BOX_MACHINE, settings.BOX_MACHINE_SECRET = "", SECRET
    path = "/internal/machine/workspaces/home/files"
    assert _get(path, calls.sign("GET", path)).status_code == 403

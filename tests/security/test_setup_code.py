"""Attack: claim a fresh box by opening its setup page first. The page creates the owner only for
whoever gives the one-time code the box's start printed; wrong codes count against the sign-in
throttle; the code is spent once the owner exists; ``createowner`` needs none."""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client

from boxsite.core import setup_code

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "a-long-password"


@pytest.fixture(autouse=True)
def _fresh_box() -> Iterator[None]:
    cache.clear()
    setup_code.spend()
    yield
    cache.clear()
    setup_code.spend()


def owners() -> list[str]:
    return list(get_user_model().objects.values_list("username", flat=True))


def claim(code: str | None, name: str = "me", address: str = "203.0.113.9", client: Client | None = None) -> Any:
    form = {"username": name, "password": PASSWORD, "password2": PASSWORD}
    if code is not None:
        form["code"] = code
    return (client or Client()).post("/setup", form, REMOTE_ADDR=address)


def test_the_setup_page_creates_the_owner_only_with_the_code_and_only_once() -> None:
    code = setup_code.issue()  # what the box's start does while it has no owner

    for wrong in (None, "", "ABCD-EFGH-JKLM"):
        refused = claim(wrong, name="stranger")
        assert refused.status_code == 400 and "setup code" in refused.content.decode()
    assert owners() == []

    made = claim(code.lower().replace("-", " "))  # as typed off a console
    assert made.status_code == 302 and made.url == "/tasks"
    assert owners() == ["me"]

    again = claim(code, name="intruder")
    assert again.status_code == 302 and again.url == "/login"
    get_user_model().objects.all().delete()  # even with the owner gone, the spent code opens nothing
    reused = claim(code, name="intruder")
    assert reused.status_code == 400 and "is not this box" in reused.content.decode()
    assert owners() == []


def test_a_web_process_on_its_own_logs_a_code_that_then_works(caplog: Any) -> None:
    with caplog.at_level(logging.WARNING, logger="box.setup"):
        page = Client().get("/setup")
    assert page.status_code == 200 and 'name="code"' in page.content.decode()
    line = next(record.getMessage() for record in caplog.records if "setup code" in record.getMessage())
    code = re.search(r"[A-Z0-9]{4}-[A-Z0-9]{4}-[A-Z0-9]{4}", line)[0]
    assert claim(code).status_code == 302
    assert owners() == ["me"]


def test_guessing_the_code_is_throttled_even_for_the_right_one() -> None:
    code = setup_code.issue()
    statuses = [claim(f"WRONG-{n:04d}-CODE").status_code for n in range(settings.BOX_SIGNIN_MAX_FAILURES + 1)]
    assert statuses[-1] == 429
    locked = claim(code)
    assert locked.status_code == 429 and "Too many wrong setup codes" in locked.content.decode()
    assert owners() == []
    assert claim(code, address="198.51.100.7").status_code == 302  # the owner, from elsewhere


def test_createowner_needs_no_code_and_spends_it(monkeypatch: Any) -> None:
    code = setup_code.issue()
    monkeypatch.setenv("BOX_OWNER_PASSWORD", PASSWORD)
    call_command("createowner", "me")
    assert owners() == ["me"]
    assert not setup_code.matches(code)

"""``createowner``: the setup page's password rule, and one owner per box."""
from __future__ import annotations

import io

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def createowner(monkeypatch: pytest.MonkeyPatch, password: str, *args: str) -> str:
    monkeypatch.setenv("BOX_OWNER_PASSWORD", password)
    out = io.StringIO()
    call_command("createowner", *args, stdout=out)
    return out.getvalue()


def test_a_password_the_setup_page_would_refuse_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CommandError, match="at least 10 characters"):
        createowner(monkeypatch, "nine-char", "me")
    assert not get_user_model().objects.exists()
    assert "created" in createowner(monkeypatch, "ten-chars!", "me")


def test_a_second_owner_is_refused_and_the_first_keeps_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    createowner(monkeypatch, "the-first-password", "me")
    for name in ("someone-else", "me"):
        with pytest.raises(CommandError, match="already has an owner \\('me'\\).*--change-password"):
            createowner(monkeypatch, "the-attackers-password", name)
    assert get_user_model().objects.count() == 1
    assert authenticate(username="me", password="the-first-password") is not None
    assert authenticate(username="me", password="the-attackers-password") is None


def test_change_password_changes_only_the_owners_password_under_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    createowner(monkeypatch, "the-first-password", "me")
    with pytest.raises(CommandError, match="at least 10 characters"):
        createowner(monkeypatch, "short", "me", "--change-password")
    with pytest.raises(CommandError, match="not named 'you'"):
        createowner(monkeypatch, "a-new-long-password", "you", "--change-password")
    assert "changed" in createowner(monkeypatch, "a-new-long-password", "me", "--change-password")
    assert authenticate(username="me", password="a-new-long-password") is not None
    assert authenticate(username="me", password="the-first-password") is None

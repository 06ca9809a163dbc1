"""Attack: guess the owner's password through the sign-in page. Failures are limited per
account from one address, per address and per account; a lock refuses even the right password
until it expires, and the owner is told at their next sign-in."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from tests.factories import make_owner

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-password"


@pytest.fixture(autouse=True)
def _fresh_counters() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def owner() -> Any:
    return make_owner()


def attempt(address: str, username: str, password: str, client: Client | None = None) -> Any:
    return (client or Client()).post("/login", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_five_wrong_passwords_lock_the_account_from_that_address_even_for_the_right_one(owner: Any) -> None:
    name = owner.get_username()
    for _ in range(4):
        assert attempt("203.0.113.5", name, "guess").status_code == 200
    locked = attempt("203.0.113.5", name, "guess")
    assert locked.status_code == 429 and "Too many failed sign-ins. Try again in 15 minutes." in locked.content.decode()
    right = attempt("203.0.113.5", name, PASSWORD)
    assert right.status_code == 429 and "_auth_user_id" not in right.client.session
    # The owner, from their own address, still gets in, and is told what happened.
    browser = Client()
    assert attempt("198.51.100.9", name, PASSWORD, browser).status_code == 302
    page = browser.get("/tasks").content.decode()
    assert "Sign-in was locked for 15 minutes" in page and "203.0.113.5" in page
    assert "Sign-in was locked" not in browser.get("/tasks").content.decode()  # told once


def test_one_address_trying_many_names_is_locked_for_all_of_them(owner: Any) -> None:
    for i in range(19):
        assert attempt("203.0.113.7", f"name{i}", "guess").status_code == 200
    assert attempt("203.0.113.7", "name-20", "guess").status_code == 429
    assert attempt("203.0.113.7", owner.get_username(), PASSWORD).status_code == 429
    assert attempt("192.0.2.1", owner.get_username(), PASSWORD).status_code == 302


def test_many_addresses_guessing_one_account_lock_it_everywhere(owner: Any) -> None:
    name = owner.get_username()
    for i in range(50):
        attempt(f"10.0.{i // 4}.{i}", name, "guess")
    assert attempt("192.0.2.2", name, PASSWORD).status_code == 429

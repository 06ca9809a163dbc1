"""A database held by another process past a request's limit: the request answers 503 with
Retry-After in the API's error shape (never a 500) and changes nothing; once the database is free
the same request succeeds."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from tasks.models import Task

pytestmark = pytest.mark.skipif(settings.DB_IS_POSTGRES, reason="SQLite's write lock")

LIMIT_S = 1.0  # the busy timeout for this test (the box's default is 20 s)

# Another program holding SQLite's own write lock (a backup, the sqlite3 shell), or another
# process of the box holding the writer gate in front of it.
HOLDERS = {
    "sqlite lock": ("import sqlite3, sys\n"
                    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "db.execute('BEGIN IMMEDIATE')\n"
                    "print('held', flush=True)\n"
                    "sys.stdin.readline()\n"
                    "db.execute('ROLLBACK')\n"),
    "writer gate": ("import fcntl, os, sys\n"
                    "fd = os.open(sys.argv[1] + '-gate', os.O_RDWR | os.O_CREAT, 0o600)\n"
                    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                    "print('held', flush=True)\n"
                    "sys.stdin.readline()\n"),
}


@pytest.fixture
def short_limit() -> Iterator[None]:
    options = connection.settings_dict["OPTIONS"]
    before = options["timeout"]
    options["timeout"] = LIMIT_S
    connection.close()  # SQLite's own wait is set when the connection opens
    yield
    options["timeout"] = before
    connection.close()


@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_a_held_database_answers_503_with_retry_after_and_the_retry_succeeds(box: Any, short_limit: None,
                                                                             holder: str) -> None:
    body = {"title": "while the database is held", "flow": {"steps": [{"run": "true"}]}}
    proc = _hold(holder)
    try:
        busy = box.api.post("/api/tasks", body, format="json")
        assert busy.status_code == 503, busy.content[:300]
        assert int(busy["Retry-After"]) > 0
        assert busy.json()["code"] == "DATABASE_BUSY" and busy.json()["field"] is None
        assert "Retry-After" in busy.json()["message"]
    finally:
        _release(proc)
    assert not Task.objects.filter(title=body["title"]).exists()  # the refused request changed nothing

    made = box.api.post("/api/tasks", body, format="json")
    assert made.status_code == 201, made.content[:300]
    assert Task.objects.filter(pk=made.json()["id"]).exists()



def _hold(holder: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDERS[holder], str(connection.settings_dict["NAME"])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_sign_in_whose_write_finds_the_database_held_answers_503_too(box: Any, short_limit: None) -> None:
    form = {"username": box.owner.get_username(), "password": "a-long-password"}
    proc = _hold("sqlite lock")
    try:
        busy = Client(raise_request_exception=False).post("/login", form)
        assert busy.status_code == 503 and int(busy["Retry-After"]) > 0
        assert "Try again" in busy.content.decode()
    finally:
        _release(proc)
    signed_in = Client().post("/login", form)
    assert signed_in.status_code == 302 and signed_in.url == "/tasks"

"""A commit's durability on PostgreSQL (docs/decisions.md, "A commit's durability"): by default a
commit does not wait for the server's log flush, as the embedded default's does not;
``BOX_DB_SYNCHRONOUS_COMMIT`` makes every commit wait for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
SHOW_OPTIONS = ("import django, json; django.setup(); from django.conf import settings; "
                "print(json.dumps(settings.DATABASES['default'].get('OPTIONS', {})))")


def options_with(tmp_path: Path, **env: str) -> dict[str, str]:
    """The database options a box process gets from its environment (settings only, no connection)."""
    full = {**os.environ, "BOX_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "boxsite.settings",
            "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres", **env}
    done = subprocess.run([sys.executable, "-c", SHOW_OPTIONS], env=full, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_commit_waits_for_the_log_flush_only_when_asked(tmp_path: Path) -> None:
    assert options_with(tmp_path, PGOPTIONS="").get("options") == "-c synchronous_commit=off"
    assert "options" not in options_with(tmp_path, BOX_DB_SYNCHRONOUS_COMMIT="1")


def test_the_options_of_pgoptions_still_count(tmp_path: Path) -> None:
    # libpq's ``options`` setting replaces the variable, which the box's own tests and an operator use
    assert options_with(tmp_path, PGOPTIONS="-c lock_timeout=300").get("options") == \
        "-c synchronous_commit=off -c lock_timeout=300"


@pytest.mark.django_db
def test_the_box_s_postgresql_connections_commit_without_waiting_for_the_flush() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's setting")
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "off"

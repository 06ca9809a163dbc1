"""A commit's durability on PostgreSQL (docs/internals/decisions-performance.md#performance): by default every commit
waits for the server's log flush; ``BOX_DB_SYNCHRONOUS_COMMIT=0`` lets a commit go without it."""
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


def test_a_commit_goes_without_the_log_flush_only_when_asked(tmp_path: Path) -> None:
    assert "options" not in options_with(tmp_path, PGOPTIONS="")
    assert options_with(tmp_path, PGOPTIONS="", BOX_DB_SYNCHRONOUS_COMMIT="0").get("options") == "-c synchronous_commit=off"


def test_the_options_of_pgoptions_still_count(tmp_path: Path) -> None:
    # libpq's ``options`` setting replaces the variable, which the box's own tests and an operator use
    assert options_with(tmp_path, PGOPTIONS="-c lock_timeout=300", BOX_DB_SYNCHRONOUS_COMMIT="0").get("options") == \
        "-c synchronous_commit=off -c lock_timeout=300"


@pytest.mark.django_db
def test_the_box_s_postgresql_connections_wait_for_the_flush_by_default() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's setting")
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


def test_the_options_of_the_database_url_still_count(tmp_path: Path) -> None:
    # dj_database_url makes ``?currentSchema=`` an ``options`` of its own; turning the flush off keeps it
    url = "postgres://postgres@127.0.0.1:5432/postgres?currentSchema=box"
    assert options_with(tmp_path, PGOPTIONS="", DATABASE_URL=url).get("options") == "-c search_path=box"
    assert options_with(tmp_path, PGOPTIONS="", DATABASE_URL=url, BOX_DB_SYNCHRONOUS_COMMIT="0").get("options") == \
        "-c synchronous_commit=off -c search_path=box"

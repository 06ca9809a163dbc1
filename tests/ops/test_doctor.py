"""``manage.py doctor``: each check named, a fix for each failure, exit 0 only when every
required check passes. Run as an operator runs it: the command, in its own process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import MANAGE
from tests.conftest import database_env

CHECKS = ("sandbox", "namespaces", "syscall filter", "cgroups", "overlayfs", "database", "redis", "data dir",
          "disk space", "chromium", "model")


def doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, MANAGE, "doctor"], env=env, capture_output=True, text=True, timeout=120, cwd=Path(MANAGE).parent)


def test_on_a_healthy_data_dir_it_names_every_check_and_exits_0(transactional_db: Any, tmp_path: Path) -> None:
    env = {**database_env(), "BOX_DATA_DIR": str(tmp_path), "BOX_SANDBOX": "off"}
    done = doctor(env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name in CHECKS:
        assert any(line[5:].startswith(f"{name}:") for line in lines), f"{name} not checked:\n{done.stdout}"
    assert "every required check passed" in done.stdout


def test_a_file_where_the_data_dir_should_be_is_refused_with_the_fix(transactional_db: Any, tmp_path: Path) -> None:
    where = tmp_path / "data"
    where.write_text("not a directory")
    done = doctor({**database_env(), "BOX_DATA_DIR": str(where)})
    assert done.returncode != 0
    assert f"BOX_DATA_DIR={where} is not a directory" in done.stderr
    assert "point BOX_DATA_DIR at a directory" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only file system")
def test_a_data_dir_the_box_cannot_write_fails_naming_the_fix(transactional_db: Any, tmp_path: Path) -> None:
    data = tmp_path / "read-only"
    data.mkdir()
    # root writes through any mode bits; a read-only file system stops it too
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(data)], check=True)
    try:
        done = doctor({**database_env(), "BOX_DATA_DIR": str(data), "BOX_SANDBOX": "off"})
    finally:
        subprocess.run(["umount", str(data)], check=True)
    assert done.returncode != 0, done.stdout
    assert f"FAIL data dir: {data} is not writable" in done.stdout, done.stdout + done.stderr
    assert f"fix: remount {data}'s file system read-write, or point BOX_DATA_DIR at a writable directory" in done.stdout
    assert "required checks failed: data dir" in done.stderr

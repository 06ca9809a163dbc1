"""A setting the box no longer has is refused at start-up with a clear error, never ignored."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_removed_database_pool_size_is_refused_by_name(tmp_path: Path) -> None:
    env = {**os.environ, "BOX_DATA_DIR": str(tmp_path), "BOX_DB_POOL_SIZE": "8"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "BOX_DB_POOL_SIZE is gone" in done.stderr
    env.pop("BOX_DB_POOL_SIZE")
    assert subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120).returncode == 0

"""A box process's threads take turns at the GIL every ``BOX_GIL_SWITCH_MS`` (docs/internals/decisions-performance.md#performance,
Performance): a worker's run and its janitor's release, a request and the publisher."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
SHOW = "import sys; print(sys.getswitchinterval())"


def _manage(tmp_path: Path, value: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BOX_DATA_DIR": str(tmp_path)}
    env.pop("BOX_GIL_SWITCH_MS", None)
    if value is not None:
        env["BOX_GIL_SWITCH_MS"] = value
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_a_box_process_switches_threads_every_box_gil_switch_ms() -> None:
    assert sys.getswitchinterval() == settings.BOX_GIL_SWITCH_MS / 1000


def test_the_default_is_a_millisecond_and_the_setting_moves_it(tmp_path: Path) -> None:
    default = _manage(tmp_path, None, "shell", "-c", SHOW)
    assert default.returncode == 0, default.stderr
    assert float(default.stdout.split()[-1]) == 0.001
    two = _manage(tmp_path, "2.5", "shell", "-c", SHOW)
    assert two.returncode == 0, two.stderr
    assert float(two.stdout.split()[-1]) == 0.0025


def test_a_switch_interval_of_zero_is_refused_by_name(tmp_path: Path) -> None:
    # ``check``: ``shell`` reports a settings module that fails to load and goes on without it
    refused = _manage(tmp_path, "0", "check")
    assert refused.returncode != 0
    assert "BOX_GIL_SWITCH_MS" in refused.stderr

"""The benches that call the box's code themselves run at their smallest, and leave nothing behind:
no data directory (nothing a background release makes again after its removal), no error."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

BENCH = Path(settings.BASE_DIR) / "bench"


@pytest.mark.skipif(settings.DB_IS_POSTGRES, reason="the benches make their own SQLite database: once, in the SQLite pass")
@pytest.mark.parametrize("argv", [
    ["layers.py", "--sizes", "100", "-n", "1", "--drivers", "copy"],  # fewer files than one directory of the tree
    ["stack_depth.py", "--depths", "2", "-n", "1", "--driver", "copy"],
], ids=["layers", "stack_depth"])
def test_a_layer_bench_runs_on_a_small_workspace_and_leaves_no_data_directory(argv: list[str], tmp_path: Path) -> None:
    _run_and_leave_nothing(argv, tmp_path)


@pytest.mark.skipif(settings.DB_IS_POSTGRES, reason="the benches make their own SQLite database: once, in the SQLite pass")
@pytest.mark.skipif(os.geteuid() != 0, reason="the view's opening is measured sandboxed: real users and mounts")
@pytest.mark.parametrize("extra", [[], ["--after-ended"]], ids=["released", "after-ended"])
def test_the_view_opening_bench_runs_sandboxed_and_leaves_no_data_directory(extra: list[str], tmp_path: Path) -> None:
    out = _run_and_leave_nothing(["view_open.py", "--depths", "1", "-n", "2", *extra], tmp_path)
    # after an ended task not yet released, the start seals it itself (a chain's link)
    assert ("sandbox.stop" in out) == bool(extra), out


@pytest.mark.skipif(settings.DB_IS_POSTGRES, reason="the benches make their own SQLite database: once, in the SQLite pass")
@pytest.mark.skipif(os.geteuid() != 0, reason="the agent's commands run sandboxed: real users and mounts")
def test_the_model_bench_runs_its_turns_beside_the_command_floor_and_leaves_no_data_directory(tmp_path: Path) -> None:
    out = _run_and_leave_nothing(["model.py", "--turns", "2", "--long-turns", "2"], tmp_path)
    for row in ("raw round-trip", "a turn in the box", "of it the sandboxed command", "of it the box beyond the command",
                "16k window (compacts near it)", "no reachable window (never compacts)"):
        assert row in out, out
    assert "load " in out, out  # the figures say the load they were measured at


def _run_and_leave_nothing(argv: list[str], tmp_path: Path) -> str:
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL", "BOX_DATA_DIR")}
    env["TMPDIR"] = str(tmp_path)  # where the bench makes its data directory
    done = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr  # a release that failed in the background is only logged
    assert list(tmp_path.iterdir()) == []
    return done.stdout

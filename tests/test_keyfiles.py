"""Generated key files: processes starting together on a fresh data directory all end with the
same key (one writer wins, the others read its key; no one reads a half-written file)."""
from __future__ import annotations

import importlib
import multiprocessing
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import boxsite.settings
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 100
RACERS = 4


def _race(barrier: Any, base: str, results: Any) -> None:
    """A box process's start, ``ROUNDS`` times: every racer reads the settings of the same fresh
    data directory at the same moment (a barrier before each)."""
    keys = []
    for round_ in range(ROUNDS):
        os.environ["BOX_DATA_DIR"] = f"{base}/data-{round_}"
        barrier.wait()
        keys.append(importlib.reload(boxsite.settings).SECRET_KEY)
    results.put(keys)


def test_processes_starting_together_on_a_fresh_data_dir_share_one_signing_key(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DJANGO_SECRET_KEY", raising=False)
    monkeypatch.delenv("DJANGO_SECRET_KEY_FILE", raising=False)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(RACERS), context.Queue()
    racers = [context.Process(target=_race, args=(barrier, str(tmp_path), results)) for _ in range(RACERS)]
    for racer in racers:
        racer.start()
    seen = [results.get(timeout=120) for _ in racers]
    for racer in racers:
        racer.join(timeout=30)
        assert racer.exitcode == 0
    split = [r for r in range(ROUNDS) if len({keys[r] for keys in seen}) != 1]
    assert not split, f"{len(split)} of {ROUNDS} simultaneous starts ended with different keys"
    for round_ in range(ROUNDS):
        key_file = tmp_path / f"data-{round_}" / "django-secret-key"
        assert len(seen[0][round_]) >= 50 and seen[0][round_] == key_file.read_text().strip()
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        assert [p.name for p in key_file.parent.iterdir() if "secret" in p.name] == ["django-secret-key"]  # no partial left


START = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    open(sys.argv[2] + ".ready-%d" % os.getpid(), "w").close()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.001)
    import boxsite.settings as settings
    print(settings.SECRET_KEY)
""")


def _start_processes(data: Path, gate: Path, count: int = 3) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY_FILE")}
    env.update(BOX_DATA_DIR=str(data), BOX_PRODUCTION="0")
    procs = [subprocess.Popen([sys.executable, "-c", START, str(ROOT), str(gate)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(count)]
    wait_for(lambda: len(list(gate.parent.glob(gate.name + ".ready-*"))) == count, timeout=60, what="processes ready")
    gate.touch()
    keys = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        keys.append(out.strip())
    return keys


def test_separate_processes_share_the_generated_key_and_keep_an_existing_one(tmp_path: Path) -> None:
    fresh = _start_processes(tmp_path / "fresh", tmp_path / "gate-1")
    assert len(set(fresh)) == 1 and fresh[0] == (tmp_path / "fresh" / "django-secret-key").read_text().strip()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "django-secret-key").write_text("k" * 60 + "\n")
    assert set(_start_processes(kept, tmp_path / "gate-2")) == {"k" * 60}

"""Both drivers against the reference model (``model.py``): seeded random sequences of tasks
(writes in place and by rename, same-size same-mtime renames, touches, deletions, ``rm -rf d &&
mkdir d``, links, hard links, mode changes, non-UTF-8 names, failures, undo anywhere in the
stack, two tasks open at once ending in either order). A few seeds here; ``bench/layers_model.py`` runs many."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers.model import Walk

SEEDS = range(12)
TASKS_PER_WALK = 12


@pytest.mark.parametrize("seed", SEEDS)
def test_the_driver_agrees_with_the_model(driver: str, seed: int, tmp_path: Path) -> None:
    Walk(driver, tmp_path / "data", seed).run(TASKS_PER_WALK)

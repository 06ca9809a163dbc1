"""Task start and diff time against workspace size, per layer driver, beside ``cp -a``.

For each size (1k, 10k, 100k files by default) a workspace base is generated, then for each
driver (overlay needs root) N tasks are started on it:

  start      tasks.layers.open_view(task): a fresh task's view over base + one done layer
  diff       the task's change set + unified diff after it changed 10 files (live, as the API
             computes it while the task runs)
  end        done: the view is unmounted / the copy captured, the layer joins the workspace
  cp -a      a plain ``cp -a`` of the same base (the floor a copying start is compared with)

The sandbox is off here (``BOX_SANDBOX=off``): this measures the layers alone. Medians of N.
Usage: .venv/bin/python bench/layers.py [-n 3] [--sizes 1000,10000,100000]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django(data: Path) -> None:
    os.environ.update({"BOX_DATA_DIR": str(data), "BOX_SQLITE_PATH": str(data / "bench.sqlite3"),
                       "BOX_SANDBOX": "off", "BOX_LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "boxsite.settings"})
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "--no-input", verbosity=0)


def make_tree(base: Path, files: int) -> None:
    base.mkdir(parents=True)
    for index in range(files):
        directory = base / f"d{index // 100:04d}"
        if index % 100 == 0:
            directory.mkdir()
        (directory / f"f{index % 100:03d}.txt").write_text(f"file {index}\n" * 8)


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def run_driver(driver: str, workspace: object, owner: object, repeats: int) -> dict[str, float]:
    from django.conf import settings

    from tasks import layers, services
    from tasks.layers import diff
    from tasks.layers.roots import changes_of
    from tasks.models import Layer, Task
    from tasks.states import State

    settings.BOX_LAYER_DRIVER = driver
    starts, diffs, ends = [], [], []
    for n in range(repeats + 1):
        task = Task.objects.create(owner=owner, title=f"bench {n}", workspace=workspace, worker="flow")
        services.transition(task, State.RUNNING)
        starts.append(timed(lambda: layers.open_view(task)))
        view = Path(settings.BOX_DATA_DIR) / "tasks" / task.pk / "view"
        for k in range(10):
            (view / f"d{k:04d}" / "f000.txt").write_text(f"changed by {task.pk}\n")
        layer = Layer.objects.get(task=task)
        diffs.append(timed(lambda: diff.render(changes_of(task, layer))))
        ends.append(timed(lambda: services.transition(task, State.DONE)))  # release runs after commit
    # the first task runs over the bare base (no layer yet): the rest show the steady state
    return {"start": statistics.median(starts[1:]), "diff": statistics.median(diffs[1:]), "end": statistics.median(ends[1:])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--drivers", default="overlay,copy")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="box-bench-layers-"))
    try:
        setup_django(data)
        from django.contrib.auth import get_user_model

        from tasks.layers.base import overlay_refusal
        from tasks.models import Workspace

        owner = get_user_model().objects.create_superuser(username="bench", password="bench-password", email="")
        drivers = [d for d in args.drivers.split(",") if d != "overlay" or overlay_refusal() is None]
        print(f"{'files':>8} {'driver':>8} {'start ms':>10} {'diff ms':>9} {'end ms':>8} {'cp -a ms':>9} {'cp/start':>9}")
        for size in [int(s) for s in args.sizes.split(",")]:
            workspace = Workspace.objects.create(name=f"w{size}", base_dir=f"w{size}")
            make_tree(workspace.base_path(), size)
            copies = []
            for _ in range(args.n):
                target = data / "cp-target"
                copies.append(timed(lambda: subprocess.run(["cp", "-a", str(workspace.base_path()), str(target)], check=True)))
                shutil.rmtree(target)
            cp = statistics.median(copies)
            for driver in drivers:
                result = run_driver(driver, workspace, owner, args.n)
                print(f"{size:>8} {driver:>8} {result['start']:>10.1f} {result['diff']:>9.1f} {result['end']:>8.1f} "
                      f"{cp:>9.1f} {cp / result['start']:>8.0f}x", flush=True)
    finally:
        from tasks.layers import mounts

        mounts.unmount_all_under(data)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()

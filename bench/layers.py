"""Task start and diff time against workspace size, per layer driver, beside ``cp -a``.

For each size (1k, 10k, 100k files by default) a workspace base is generated, then for each
driver (overlay needs root) N tasks are started on it:

  start      tasks.layers.open_view(task): a fresh task's view over base + one done layer
  diff       the task's change set + unified diff after it changed 10 files (live, as the API
             computes it while the task runs)
  end        done: the view is unmounted / the copy captured, the layer joins the workspace
  cp -a      a plain ``cp -a`` of the same base (the floor a copying start is compared with)

The sandbox is off here (``BOX_SANDBOX=off``): this measures the layers alone. With
``--disk-mb N`` each driver runs again with that disk limit (``driver+disk``: the task's own
image, ``tasks.layers.disk``), the sandbox on but no task user made. Medians of N.
Usage: .venv/bin/python bench/layers.py [-n 3] [--sizes 1000,10000,100000] [--disk-mb 10240]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from harness import new_data_dir, remove_data_dir, setup_django


def make_tree(base: Path, files: int) -> None:
    base.mkdir(parents=True)
    for index in range(files):
        directory = base / f"d{index // 100:04d}"
        if index % 100 == 0:
            directory.mkdir()
        (directory / f"f{index % 100:03d}.txt").write_text(f"file {index}\n" * 8)


def changed_files(files: int, count: int = 10) -> list[str]:
    """The files a task changes, of the ``files`` ``make_tree`` made: the first of each of the
    first ``count`` directories, or in a tree with fewer, ``count`` spread over it."""
    picked = sorted({k * min(files, 100 * count) // count for k in range(count)})
    return [f"d{index // 100:04d}/f{index % 100:03d}.txt" for index in picked]


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1000


def run_driver(driver: str, workspace: object, owner: object, files: int, repeats: int,
               disk_mb: int | None = None) -> dict[str, float]:
    from django.conf import settings

    from tasks import layers, services
    from tasks.layers import diff
    from tasks.layers.roots import changes_of
    from tasks.models import Layer, Task
    from tasks.states import State

    settings.BOX_LAYER_DRIVER = driver
    starts, diffs, ends = [], [], []
    for n in range(repeats + 1):
        limits = {"disk_mb": disk_mb} if disk_mb else {}
        task = Task.objects.create(owner=owner, title=f"bench {n}", workspace=workspace, worker="flow", limits=limits)
        services.transition(task, State.RUNNING)
        starts.append(timed(lambda: layers.open_view(task)))
        view = Path(settings.BOX_DATA_DIR) / "tasks" / task.pk / "view"
        for name in changed_files(files):
            (view / name).write_text(f"changed by {task.pk}\n")
        layer = Layer.objects.get(task=task)
        diffs.append(timed(lambda: diff.render(changes_of(task, layer))))
        ends.append(timed(lambda: services.transition(task, State.DONE)))  # release runs after commit
        if disk_mb:
            time.sleep(0.2)  # the spare image made in the background, off the next start's clock
    # the first task runs over the bare base (no layer yet): the rest show the steady state
    return {"start": statistics.median(starts[1:]), "diff": statistics.median(diffs[1:]), "end": statistics.median(ends[1:])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=3)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--drivers", default="overlay,copy")
    parser.add_argument("--disk-mb", type=int, default=0,
                        help="also run each driver with this disk limit (needs root: a loop-mounted image per task)")
    args = parser.parse_args()
    data = new_data_dir("box-bench-layers-")
    try:
        # the sandbox is on only for the disk limit (which sandboxed tasks get); no task user is made here
        setup_django(data, sandbox="auto" if args.disk_mb else "off")
        from django.conf import settings

        settings.BOX_TASK_DISK_MB = 0  # the rows without a limit have none
        from django.contrib.auth import get_user_model

        from tasks.layers.base import overlay_refusal
        from tasks.models import Workspace

        owner = get_user_model().objects.create_superuser(username="bench", password="bench-password", email="")
        drivers = [d for d in args.drivers.split(",") if d != "overlay" or overlay_refusal() is None]
        print(f"{'files':>8} {'driver':>12} {'start ms':>10} {'diff ms':>9} {'end ms':>8} {'cp -a ms':>9} {'cp/start':>9}")
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
                for disk_mb in ([None, args.disk_mb] if args.disk_mb else [None]):
                    result = run_driver(driver, workspace, owner, size, args.n, disk_mb)
                    name = f"{driver}+disk" if disk_mb else driver
                    print(f"{size:>8} {name:>12} {result['start']:>10.1f} {result['diff']:>9.1f} {result['end']:>8.1f} "
                          f"{cp:>9.1f} {cp / result['start']:>8.0f}x", flush=True)
    finally:
        remove_data_dir(data)


if __name__ == "__main__":
    main()

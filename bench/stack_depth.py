"""A task's start and release against the number of done tasks in its workspace.

A start (``open_view``) and a release should cost what the mounted stack costs
(bounded by ``BOX_LAYER_MAX_DEPTH`` through compaction), not one step per done task. For a
workspace with ``--depths`` done tasks (each one small file), tasks are started and released
one after the other; each line gives the median ms per start and per release, the calls of
``seal_layer`` and ``Meta.load`` per task, and the floor: one overlay mount and unmount of the
same lower directories. Times are this thread's CPU (user + system), not wall clock. The sandbox is off (no task user): this measures the layers alone.
With ``--owner UID`` each view is opened for that user, as for a sandboxed task (id-mapped lower
layers); under ``strace -f -c`` the difference of two runs with different ``-n`` gives the
mkdir, mount and unmount calls per task.
Usage: .venv/bin/python bench/stack_depth.py [-n 5] [--depths 5,200] [--owner 65534]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import new_data_dir, remove_data_dir, setup_django


def counting(module: Any, name: str, counts: Counter[str]) -> None:
    """Count the calls of ``module.name`` (also where it was imported by name elsewhere)."""
    original = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return original(*args, **kwargs)

    setattr(module, name, wrapper)


def ms(action: Callable[[], object]) -> float:
    """The CPU this thread spent on ``action`` (user and system): steady on a shared machine."""
    start = time.thread_time()
    action()
    return (time.thread_time() - start) * 1000


def one_task(workspace: Any, owner: Any, n: int, owner_uid: int | None = None) -> tuple[float, float, float, int]:
    """Start a task, write a file, end it done: (start ms, release ms, floor ms, lower dirs mounted)."""
    # The box's code imports only once main's ``setup_django`` configured Django on the bench's data dir.
    from django.conf import settings

    from tasks import layers, services
    from tasks.layers import mounts, paths, task_view
    from tasks.models import Layer, Task
    from tasks.states import State

    task = Task.objects.create(owner=owner, title=f"t{n}", workspace=workspace, worker="flow")
    services.transition(task, State.RUNNING)
    task.refresh_from_db()
    start = ms(lambda: layers.open_view(task))
    (paths.view_dir(task.pk) / f"f{n}.txt").write_text(f"task {n}\n")
    floor, lowerdirs = 0.0, []
    lowers = mounts.mounts_under(paths.view_dir(task.pk))
    if lowers:
        options = Path("/proc/self/mountinfo").read_text()
        target = Path(settings.BOX_DATA_DIR) / "floor"
        for name in ("view", "upper", "work"):
            (target / name).mkdir(parents=True, exist_ok=True)
        owner = (paths.layer_dir(task.pk) / "upper").stat()
        os.chown(target / "upper", owner.st_uid, owner.st_gid)  # as the task's (its user's, with --owner)
        line = next(ln for ln in options.splitlines() if f" {paths.view_dir(task.pk)} " in ln)
        lowerdirs = line.split("lowerdir=", 1)[1].split(",", 1)[0].split(":")

        def mount_and_unmount() -> None:
            mounts.mount_overlay(target / "view", [Path(p) for p in lowerdirs], target / "upper", target / "work")
            mounts.unmount(target / "view")

        floor = ms(mount_and_unmount)
        shutil.rmtree(target)
    Task.objects.filter(pk=task.pk).update(state=State.DONE)
    task.refresh_from_db()
    task_view.on_final_move(task, State.DONE)
    release = ms(lambda: task_view.release(task.pk))
    if owner_uid is not None:  # the sandbox's stop hands a task's files back to root
        subprocess.run(["chown", "-R", "0:0", str(paths.layer_dir(task.pk))], check=True)
    assert Layer.objects.get(task=task).state == "applied"
    return start, release, floor, len(lowerdirs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=5)
    parser.add_argument("--depths", default="5,200")
    parser.add_argument("--driver", default="overlay")
    parser.add_argument("--owner", type=int, default=None,
                        help="open each view for this uid (and gid), as for a sandboxed task: id-mapped lower layers")
    args = parser.parse_args()
    data = new_data_dir("box-bench-depth-")
    try:
        setup_django(data, sandbox="off")
        # imported only now: Django is configured by ``setup_django`` on this data directory
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from tasks.layers import task_view, tree
        from tasks.models import Workspace

        settings.BOX_LAYER_DRIVER = args.driver
        if args.owner is not None:
            task_view._sandbox_owner = lambda task: (args.owner, args.owner)  # type: ignore[assignment]
        counts: Counter[str] = Counter()
        counting(task_view, "seal_layer", counts)
        counting(tree.Meta, "load", counts)
        owner = get_user_model().objects.create_superuser(username="bench", password="bench-password", email="")
        print(f"{'done':>6} {'mounted':>8} {'start ms':>9} {'release ms':>11} {'floor ms':>9} {'seals/task':>11} {'metas/task':>11}")
        for depth in [int(d) for d in args.depths.split(",")]:
            workspace = Workspace.objects.create(name=f"w{depth}", base_dir=f"w{depth}")
            workspace.base_path().mkdir(parents=True, exist_ok=True)
            (workspace.base_path() / "README").write_text("base\n")
            for n in range(depth):
                one_task(workspace, owner, n, args.owner)
            counts.clear()
            results = [one_task(workspace, owner, depth + n, args.owner) for n in range(args.n)]
            mounted = max(r[3] for r in results)
            print(f"{depth:>6} {mounted:>8} {statistics.median(r[0] for r in results):>9.2f} "
                  f"{statistics.median(r[1] for r in results):>11.2f} {statistics.median(r[2] for r in results):>9.2f} "
                  f"{counts['seal_layer'] / args.n:>11.1f} {counts['load'] / args.n:>11.1f}", flush=True)
    finally:
        remove_data_dir(data)


if __name__ == "__main__":
    main()

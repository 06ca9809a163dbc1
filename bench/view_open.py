"""A sandboxed trivial task's start, phase by phase: ``lifecycle.prepare`` (the task's user,
then ``layers.open_view``), in process, at a workspace with ``--depths`` done tasks.

Each task is started as a worker starts it (the sandbox on, the overlay driver, the disk limit
when this machine has it), writes one file, ends done and is released at once (no janitor
thread: a start never waits for another's seal here). For each phase: wall and this thread's
CPU ms per start (median), and, from an audit hook and counters, the system calls of the whole
start that matter here (mkdir, mounts, fsync, child processes, files opened). The spare disk
images are made before each measured start (``disk.make_spares`` waited for), so no ``mkfs``
runs beside it.
``--after-ended``: as a chain's worker starts a dependent, the task before it is left ended but
not released, so the measured start stops and seals it itself; its release follows, untimed.
The workspace's stack grows by one with each measured start (``--depths 1``: 1 to 1 + n).
``BENCH_WHERE=os.mkdir`` (an audit event) tells where each such call was made from;
``BENCH_PROFILE=FILE`` writes a cProfile (this thread's CPU) of the measured starts.
Usage: .venv/bin/python bench/view_open.py [-n 9] [--depths 1,200] [--after-ended]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from harness import new_data_dir, remove_data_dir, setup_django

WALL: dict[str, float] = defaultdict(float)
CPU: dict[str, float] = defaultdict(float)
CALLS: Counter[str] = Counter()
_counting = False
WHERE: Counter[str] = Counter()
_where_event = os.environ.get("BENCH_WHERE", "")
# BENCH_PROFILE=FILE: the measured starts under cProfile (this thread's CPU), written to FILE
PROFILE = cProfile.Profile(time.thread_time) if os.environ.get("BENCH_PROFILE") else None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _counting or threading.get_ident() != threading.main_thread().ident:
        return  # the start's own calls: not the spare images' maker or the pool's refill beside it
    if _where_event and event == _where_event:
        frames = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()[-6:-1]]
        WHERE[" < ".join(reversed(frames))] += 1
    if event in ("os.mkdir", "os.symlink", "os.rename", "os.chmod", "os.chown", "os.remove", "os.listdir",
                 "os.scandir", "subprocess.Popen", "os.fork", "os.posix_spawn"):
        CALLS[event.split(".", 1)[1]] += 1
    elif event == "open":
        CALLS["open"] += 1


def timed(owner: Any, name: str, label: str | None = None) -> None:
    """Add the wall and CPU of every call of ``owner.name`` to its phase."""
    original = getattr(owner, name)
    label = label or name

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _counting or threading.get_ident() != threading.main_thread().ident:
            return original(*args, **kwargs)  # the release's calls (the seal's meta, its roots) are not the start's
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            WALL[label] += time.perf_counter() - wall
            CPU[label] += time.thread_time() - cpu

    setattr(owner, name, wrapper)


def counted(owner: Any, name: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _counting:
            CALLS[name] += 1
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


@contextmanager
def counting() -> Iterator[None]:
    global _counting
    _counting = True
    try:
        yield
    finally:
        _counting = False


def wait_for(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the spare disk images were not made in time")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=9)
    parser.add_argument("--depths", default="1,200")
    parser.add_argument("--after-ended", action="store_true",
                        help="the task before is not released before a start: the start seals it (a chain's link)")
    args = parser.parse_args()
    data = new_data_dir("box-bench-open-")
    try:
        setup_django(data, sandbox="auto")
        # The box's code imports only once ``setup_django`` configured Django on this data dir.
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from tasks import sandbox, services
        from tasks.layers import compaction, disk, mounts, overlay, paths, stack_record, task_view, tree
        from tasks.models import Task, Workspace
        from tasks.run import lifecycle
        from tasks.sandbox import users
        from tasks.states import State

        if not sandbox.available():
            sys.exit(f"the sandbox is not available here: {sandbox.support.missing_reason()}")
        settings.BOX_LAYER_DRIVER = "overlay"
        limit = int(settings.BOX_TASK_DISK_MB) if disk.unavailable() is None else 0
        for owner, name, label in (
            (sandbox, "prepare", "sandbox.prepare (the user)"),
            (task_view, "record_layer", "layer row + stack (record_layer)"),
            (task_view, "seal_stack", "seal_stack (the lowers sealed?)"),
            (task_view, "_reopen", "_reopen (a retry's layer)"), (task_view, "_open_disk", "disk image (_open_disk)"),
            (task_view, "roots_for", "roots_for (lower trees, flat)"),
            (overlay.OverlayDriver, "open", "driver.open (all)"), (overlay, "_mount_idmapped", "  id-mapped lowers, mounted"),
            (overlay, "adopt", "  upper given to the user"), (mounts, "mount_overlay", "  overlay mount"),
            (disk, "reserve", "disk.reserve"), (tree.Meta, "save", "meta saved (fsync)"),
            (task_view, "seal_layer", "  seal_layer (the task before)"), (sandbox, "stop", "    sandbox.stop"),
            (task_view, "_unmount", "    its view unmounted"), (overlay.OverlayDriver, "seal", "    driver.seal"),
            (stack_record, "write_seal", "    write_seal (its row)"), (task_view, "rows_of", "    its rows read"),
            (disk, "settle", "    disk.settle (upper out of its image)"),
            (task_view, "changes_of", "    changes_of (the manifest)"), (compaction, "read_trees", "    read_trees"),
            (lifecycle, "prepare", "prepare (all)"),
        ):
            timed(owner, name, label)
        counted(os, "fsync")
        for name in ("clone_idmapped", "attach_idmapped", "mount_overlay", "mount_overlay_layers", "bind", "mount_image"):
            counted(mounts, name)
        sys.addaudithook(_audit)
        user = get_user_model().objects.create_superuser(username="bench", password="bench-password", email="")

        def one_task(workspace: Workspace, n: int, measure: bool) -> None:
            task = Task.objects.create(owner=user, title=f"t{n}", workspace=workspace, worker="flow")
            services.transition(task, State.RUNNING)
            task = Task.objects.select_related("workspace").get(pk=task.pk)
            if limit:
                disk.make_spares(limit)
                wait_for(lambda: len(list(disk._spares_dir().glob(f"{limit}-*.img"))) >= disk.SPARES
                         and not disk._making)
            lifecycle.janitor.drain()
            users.fill_pool()  # a free user ready, as the pool keeps one: no account tool on the start
            if measure and PROFILE is not None:
                PROFILE.enable()
                with counting():
                    lifecycle.prepare(task)
                PROFILE.disable()
            elif measure:
                with counting():
                    lifecycle.prepare(task)
            else:
                lifecycle.prepare(task)
            release_ended()
            (paths.view_dir(task.pk) / f"f{n}.txt").write_text(f"task {n}\n")
            Task.objects.filter(pk=task.pk).update(state=State.DONE)
            task.refresh_from_db()
            task_view.on_final_move(task, State.DONE)
            if args.after_ended:
                ended.append(task.pk)  # released after the next start, which seals it
            else:
                assert lifecycle.release(task.pk)

        ended: list[str] = []

        def release_ended() -> None:
            while ended:
                assert lifecycle.release(ended.pop())

        print(f"disk limit {limit or 'off'} MB, BOX_LAYER_MAX_DEPTH {compaction.max_depth()}", flush=True)
        for depth in [int(d) for d in args.depths.split(",")]:
            workspace = Workspace.objects.create(name=f"w{depth}", base_dir=f"w{depth}")
            workspace.base_path().mkdir(parents=True, exist_ok=True)
            (workspace.base_path() / "README").write_text("base\n")
            for n in range(depth):
                one_task(workspace, n, measure=False)
            walls: dict[str, list[float]] = defaultdict(list)
            cpus: dict[str, list[float]] = defaultdict(list)
            CALLS.clear()
            for n in range(args.n):
                WALL.clear()
                CPU.clear()
                one_task(workspace, depth + n, measure=True)
                for label in WALL:
                    walls[label].append(WALL[label] * 1000)
                    cpus[label].append(CPU[label] * 1000)
            print(f"\n{depth} done tasks before; median of {args.n} starts, ms")
            print(f"{'phase':<40} {'wall':>7} {'CPU':>7}")
            for label in walls:
                print(f"{label:<40} {statistics.median(walls[label]):>7.2f} {statistics.median(cpus[label]):>7.2f}")
            for where, count in WHERE.most_common(15):
                print(f"  {count / args.n:5.1f} {where}")
            WHERE.clear()
            print("per start: " + ", ".join(f"{name} {count / args.n:.1f}" for name, count in sorted(CALLS.items())), flush=True)
        release_ended()
        if PROFILE is not None:
            PROFILE.dump_stats(os.environ["BENCH_PROFILE"])
    finally:
        if "users" in locals():
            lifecycle.janitor.drain()
            users.empty_pool()
        remove_data_dir(data)


if __name__ == "__main__":
    main()

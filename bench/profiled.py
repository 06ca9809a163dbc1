"""Run one of a bench box's commands under cProfile: every thread of it and of every process it forks.

Usage: python bench/profiled.py OUTDIR ARGV...   (``harness.BenchBox`` does it for each of its
processes when ``BOX_BENCH_PROFILE=OUTDIR`` is set; then ``bench/profile_report.py OUTDIR``.)

Each thread gets a profile of its own, written to ``OUTDIR/<command>-<pid>-<n>.prof`` every
second and at exit. The profiles count CPU time (``time.thread_time``), so they hold on a busy
machine; ``BOX_BENCH_PROFILE_WALL=1`` counts wall time instead. Touching ``OUTDIR/reset`` clears
every profile, so a bench can leave its warm-up out (the harness does once the box answers).
A process killed outright loses at most its last second.
"""
from __future__ import annotations

import atexit
import cProfile
import itertools
import marshal
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

OUT = Path(sys.argv[1])
ARGV = sys.argv[2:]
COMMAND = ARGV[1] if ARGV[0] == "-m" else (ARGV[1] if len(ARGV) > 1 and ARGV[0].endswith("manage.py") else Path(ARGV[0]).stem)
TIMER = time.perf_counter if os.environ.get("BOX_BENCH_PROFILE_WALL") == "1" else time.thread_time
RESET = OUT / "reset"

# sequence number in this process -> (its thread, its profile, written since the thread ended)
_profiles: dict[int, tuple[threading.Thread, cProfile.Profile, bool]] = {}
_lock = threading.Lock()
_numbers = itertools.count()
DUMPER = "bench-profile"


def _profile_this_thread() -> None:
    profile = cProfile.Profile(TIMER)
    with _lock:
        _profiles[next(_numbers)] = (threading.current_thread(), profile, False)
    profile.enable()


def _first_event_of_a_thread(_frame: Any, _event: str, _arg: Any) -> None:
    # threading calls this hook on a new thread's first event; the profile it enables replaces it.
    if threading.current_thread().name == DUMPER:
        sys.setprofile(None)  # the profiler's own writing is not the box's
        return
    _profile_this_thread()


def _reset_mark() -> float:
    try:
        return RESET.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _dump() -> None:
    pid = os.getpid()
    with _lock:
        profiles = [(number, profile) for number, (_, profile, final) in _profiles.items() if not final]
        for number, (thread, profile, _) in list(_profiles.items()):
            if not thread.is_alive():  # written once more now, then no longer
                _profiles[number] = (thread, profile, True)
    for number, profile in profiles:
        profile.snapshot_stats()  # type: ignore[attr-defined]  # cProfile's own, what dump_stats uses
        path = OUT / f"{COMMAND}-{pid}-{number}.prof"
        partial = path.with_suffix(".part")
        with partial.open("wb") as out:
            marshal.dump(profile.stats, out)  # type: ignore[attr-defined]
        partial.replace(path)


def _dumper() -> None:
    seen = _reset_mark()
    while True:
        time.sleep(1)
        mark = _reset_mark()
        if mark != seen:
            seen = mark
            with _lock:
                for number, (thread, profile, _) in list(_profiles.items()):
                    profile.clear()
                    _profiles[number] = (thread, profile, False)  # its file is written again, empty
        _dump()


def _start() -> None:
    threading.setprofile(_first_event_of_a_thread)
    _profile_this_thread()
    threading.Thread(target=_dumper, daemon=True, name=DUMPER).start()


def _in_child() -> None:
    # The forking thread's profile came along with the parent's figures, the other threads did not.
    for _, profile, _ in _profiles.values():
        profile.disable()
    _profiles.clear()
    _start()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    os.register_at_fork(after_in_child=_in_child)
    atexit.register(_dump)
    _start()
    sys.argv = ARGV[1:] if ARGV[0] == "-m" else ARGV
    if ARGV[0] == "-m":
        runpy.run_module(ARGV[1], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, str(Path(ARGV[0]).resolve().parent))
        runpy.run_path(ARGV[0], run_name="__main__")


if __name__ == "__main__":
    main()

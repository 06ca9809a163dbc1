"""What the profiles ``bench/profiled.py`` wrote add up to, per command.

Usage: .venv/bin/python bench/profile_report.py OUTDIR [--command qcluster] [--sort tottime|cumulative] [-n 30]
       [--per N]   (divide by N: the tasks the bench ran, for milliseconds per task)

Prints each command's total (CPU seconds, or wall with ``BOX_BENCH_PROFILE_WALL=1``) and its top
functions across all its processes and threads.
"""
from __future__ import annotations

import argparse
import io
import pstats
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--command", help="only this command's profiles (daphne, qcluster, runscheduler, ...)")
    parser.add_argument("--sort", default="tottime", choices=("tottime", "cumulative", "ncalls"))
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--per", type=int, default=1, help="divide the figures by this many tasks")
    args = parser.parse_args()
    by_command: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(args.outdir.glob("*.prof")):
        if path.stat().st_size > 2:  # a thread that ran nothing after the reset wrote an empty table
            by_command[path.name.split("-", 1)[0]].append(path)
    for command, paths in sorted(by_command.items()):
        if args.command and command != args.command:
            continue
        stats = pstats.Stats(str(paths[0]), stream=io.StringIO())
        for path in paths[1:]:
            stats.add(str(path))
        total = stats.total_tt  # type: ignore[attr-defined]
        print(f"\n== {command}: {len(paths)} thread profiles, {total:.2f} s in all, {total * 1000 / args.per:.1f} ms per task")
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats(args.sort).print_stats(args.n)
        lines = out.getvalue().splitlines()
        start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
        print("\n".join(line for line in lines[start:] if line.strip()))


if __name__ == "__main__":
    main()

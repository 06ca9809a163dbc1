"""The long run of the layer model test: many seeded random walks per driver against the
reference model in ``tests/layers/model.py`` (the suite runs a few). Prints, per driver, how
many walks agreed, and the history of the first that did not.

Usage: .venv/bin/python bench/layers_model.py [--walks 200] [--tasks 12] [--drivers overlay,copy]
(overlay needs root; a failing walk is replayed exactly with --first SEED --walks 1)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness import setup_django


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--walks", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--drivers", default="overlay,copy")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="box-model-"))
    setup_django(data, migrate=False)
    from tasks.layers import mounts
    from tests.layers.model import Walk

    failed = 0
    try:
        for driver in args.drivers.split(","):
            if driver == "overlay" and os.geteuid() != 0:
                print(f"{driver:8} skipped: needs root")
                continue
            agreed, first_failure = 0, ""
            started = time.perf_counter()
            for seed in range(args.first, args.first + args.walks):
                where = data / f"{driver}-{seed}"
                try:
                    Walk(driver, where, seed).run(args.tasks)
                    agreed += 1
                except AssertionError as exc:
                    first_failure = first_failure or f"seed {seed}: {exc}"
                finally:
                    mounts.unmount_all_under(where)
                    shutil.rmtree(where, ignore_errors=True)
            seconds = time.perf_counter() - started
            print(f"{driver:8} {agreed}/{args.walks} walks of {args.tasks} tasks agreed with the model "
                  f"({seconds / args.walks * 1000:.0f} ms a walk)")
            if first_failure:
                failed += 1
                print(first_failure)
    finally:
        mounts.unmount_all_under(data)
        shutil.rmtree(data, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

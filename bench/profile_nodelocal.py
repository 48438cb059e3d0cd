"""Where corectl's own CPU goes in a node-local no-op (issue 30): cProfile in every thread of one
in-process `corectl provision` (the node jobs run in worker threads, which a plain cProfile of the
main thread would not see), on the bench lab that `make bench BENCH_ARGS="... --keep"` left running.

    .venv/bin/python bench/profile_nodelocal.py [--top 25]

Prints corectl's own CPU seconds, the run's control-host CPU from its record, and the functions
with the most time of their own, summed over all threads.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    if not fleet.SITE.joinpath("cluster.yml").is_file():
        raise SystemExit(f"no bench lab at {fleet.SITE}: run make bench with --keep first")
    from corectl.cli import app

    profiles: list[cProfile.Profile] = []

    def start_profiling(*_: Any) -> None:  # the first profile event of a new thread: hand it to cProfile
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    main_profile = cProfile.Profile()
    profiles.append(main_profile)
    fleet.with_sections(fleet.NODE_LOCAL)
    try:
        threading.setprofile(start_profiling)
        before = resource.getrusage(resource.RUSAGE_SELF)
        main_profile.enable()
        try:
            app(["provision", "--inventory", str(fleet.SITE)], standalone_mode=False)
        finally:
            main_profile.disable()
            threading.setprofile(None)  # type: ignore[arg-type]
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        fleet.with_sections()
    record = fleet.last_run()
    own = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    nodes = [s for s in record.get("shards", []) if s["name"] != "services"]
    said = f"corectl's own CPU under the profiler: {own:.2f} s for {len(nodes)} node jobs"
    print(f"\n{said}; the run's record (profiled too): {record.get('control_cpu_s')}")
    out = io.StringIO()
    stats = pstats.Stats(*[p for p in profiles if p.getstats()], stream=out)
    stats.sort_stats("tottime").print_stats(options.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()

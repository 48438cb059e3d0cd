"""Where corectl's own CPU goes in a node-local no-op (issue 30): cProfile in every thread of one
in-process `corectl provision` (the node jobs run in worker threads, which a plain cProfile of the
main thread would not see), on the bench lab that `make bench BENCH_ARGS="... --keep"` left running.

    .venv/bin/python bench/profile_nodelocal.py [--top 25] [--limit HOSTS] [--cpu]

Prints corectl's own CPU seconds, the run's control-host CPU from its record, and the functions
with the most time of their own, summed over all threads; then the same for the processes that
follow the node jobs (corectl.ansible.remote.followers: forked, each profiled in all its threads
and its own CPU taken from getrusage as it ends).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--limit", help="provision --limit (the head and some DGX: the run stays node-local)")
    parser.add_argument("--cpu", action="store_true", help="time each thread's CPU (time.thread_time), not wall time")
    options = parser.parse_args()

    def new_profile() -> cProfile.Profile:  # (--cpu: a thread blocked in a read or a wait costs nothing)
        return cProfile.Profile(time.thread_time) if options.cpu else cProfile.Profile()

    if not fleet.SITE.joinpath("cluster.yml").is_file():
        raise SystemExit(f"no bench lab at {fleet.SITE}: run make bench with --keep first")
    from corectl.cli import app

    profiles: list[cProfile.Profile] = []

    def start_profiling(*_: Any) -> None:  # the first profile event of a new thread: hand it to cProfile
        profile = new_profile()
        profiles.append(profile)
        profile.enable()

    from corectl.ansible.remote import followers

    followed = Path(tempfile.mkdtemp(prefix="corectl-followers-"))
    original = followers._child

    def profiled_child(*args: Any) -> None:  # a follower process (forked): its threads profiled, dumped as it ends
        profiles.clear()  # (the parent's, copied by the fork)
        mine = new_profile()
        profiles.append(mine)
        mine.enable()
        try:
            original(*args)
        finally:
            mine.disable()
            used = resource.getrusage(resource.RUSAGE_SELF)
            pstats.Stats(*[p for p in profiles if p.getstats()]).dump_stats(followed / f"{os.getpid()}.prof")
            (followed / f"{os.getpid()}.cpu").write_text(f"{used.ru_utime + used.ru_stime}")

    followers._child = profiled_child  # type: ignore[assignment]
    main_profile = new_profile()
    profiles.append(main_profile)
    fleet.with_sections(fleet.NODE_LOCAL)
    try:
        threading.setprofile(start_profiling)
        before = resource.getrusage(resource.RUSAGE_SELF)
        main_profile.enable()
        try:
            limit = ["--limit", options.limit] if options.limit else []
            app(["provision", "--inventory", str(fleet.SITE), *limit], standalone_mode=False)
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
    dumps = sorted(followed.glob("*.prof"))
    if dumps:
        cpu = sum(float(p.read_text()) for p in followed.glob("*.cpu"))
        print(f"the {len(dumps)} follower processes' own CPU (getrusage, profiled): {cpu:.2f} s")
        out = io.StringIO()
        pstats.Stats(*[str(p) for p in dumps], stream=out).sort_stats("tottime").print_stats(options.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()

"""What a node-local run's own process spends per event it is handed (issue 49 item 1): a run's events through the
run's Live (its Tally), a Returned and the live display (LiveProgress, printing to memory), whole as a thread of the
run's process hands them on, and slimmed (corectl.ansible.events.slim) and unpickled as a group's process sends them
(corectl.ansible.remote.followers); and what slimming costs the group's process. Best of --rounds each, alternating,
in one process (these machines are noisy).

    .venv/bin/python bench/event_delivery.py RUN_DIR [--rounds 5]

RUN_DIR: a run's folder with a job_events/ folder (any provision's; `corectl runs` lists them).
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import resource
from pathlib import Path
from typing import Any

from rich.console import Console

from corectl.ansible.events import SHARD_KEY, Returned, RunRequest, slim
from corectl.ansible.lifecycle import Cancel, Live
from corectl.progress import LiveProgress
from corectl.site import Site


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def handed(events: list[dict[str, Any]], crossed: bool) -> float:
    """CPU seconds to hand ``events`` to a run's Live (crossed: pickled by a group's process, unpickled here)."""
    site = Site(root=Path("/nonexistent"), directory=Path("/nonexistent"))
    with LiveProgress(Console(file=io.StringIO(), width=200), "provision") as progress:
        live = Live(RunRequest(site=site), "bench", Path("/nonexistent"), Cancel(), sink=Returned("k", progress))
        sent = pickle.dumps(events) if crossed else b""
        start = cpu()
        for event in pickle.loads(sent) if crossed else events:
            live(event)
        return cpu() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    paths = [p for p in (options.run_dir / "job_events").glob("*.json") if not p.name.endswith("-partial.json")]
    events = sorted((json.loads(p.read_text()) for p in paths), key=lambda e: int(e.get("counter") or 0))
    if not events:
        raise SystemExit(f"{options.run_dir}: no events in its job_events/")
    for event in events:
        event[SHARD_KEY] = "dgx01"
    whole, crossed, slimming = [], [], []
    for _ in range(options.rounds):
        whole.append(handed([dict(e) for e in events], crossed=False))
        start = cpu()
        slimmed = [slim(e) for e in events]
        slimming.append(cpu() - start)
        crossed.append(handed(slimmed, crossed=True))
    count = len(events)
    print(f"{count} events; CPU seconds, best of {options.rounds}")
    for name, spent in (("whole, in the run's process", whole), ("slim, unpickled there", crossed)):
        print(f"  {name:30s} {min(spent):.4f} s  {min(spent) / count * 1e6:6.1f} us per event")
    print(f"  {'slim() in a group process':30s} {min(slimming):.4f} s  {min(slimming) / count * 1e6:6.1f} us per event")


if __name__ == "__main__":
    main()

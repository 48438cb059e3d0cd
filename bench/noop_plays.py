"""Where a no-op's tasks go, play by play (issue 49 item 3): for each run given, each play's task results per
host that ran it (those that did something to check: ok or changed; and those skipped), the tasks it started
and its wall seconds, read from the runs' records with corectl's own reader (corectl runs --show's); two or more
runs side by side, the first as the baseline, with each play's change in results against it.

    .venv/bin/python bench/noop_plays.py RUN_DIR [RUN_DIR ...] [--names old,new]

RUN_DIR: a run's folder under a site's .runs/ (a no-op provision of the same lab layout in each run, e.g. one
made by an older commit's corectl and one by today's: docs/performance.md says how).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from corectl.commands.runs import load_events
from corectl.progress import outcome


@dataclass
class Play:
    """One play of a run: its task results by outcome, the hosts that had any, the tasks it started, its time."""

    name: str
    results: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hosts: set[str] = field(default_factory=set)
    tasks: int = 0
    seconds: float = 0.0

    @property
    def checked(self) -> int:
        """Task results that ran something on a host (not skipped)."""
        return self.results["ok"] + self.results["changed"] + self.results["failed"]


def plays(events: list[dict[str, Any]]) -> dict[str, Play]:
    """The run's plays in order, each play named once (a play that appears twice, as the fanned-out shards'
    plays do, is summed)."""
    found: dict[str, Play] = {}
    current: Play | None = None
    started: datetime | None = None
    for event in events:
        kind, data = event.get("event"), event.get("event_data") or {}
        at = datetime.fromisoformat(event["created"]) if event.get("created") else None
        if kind in ("playbook_on_play_start", "playbook_on_stats"):
            if current is not None and started is not None and at is not None:
                current.seconds += (at - started).total_seconds()
            current, started = None, at
            if kind == "playbook_on_play_start":
                name = str(data.get("name") or data.get("play") or "")
                current = found.setdefault(name, Play(name))
        elif current is None:
            continue
        elif kind == "playbook_on_task_start":
            current.tasks += 1
        elif (result := outcome(event)) is not None and data.get("host"):
            current.results[result] += 1
            current.hosts.add(str(data["host"]))
    return found


def table(runs: dict[str, dict[str, Play]]) -> list[str]:
    """One line per play (in the order of the last run, then the plays only earlier runs had), and a total."""
    names = list(runs)
    order = list(runs[names[-1]])
    order += [p for run in runs.values() for p in run if p not in order]
    width = max(len(p) for p in order)
    head = f"{'play':{width}}" + "".join(f" | {n:>28}" for n in names) + " |  results vs first"
    lines = [head, f"{'':{width}}" + " | results skip tasks  hosts   s" * len(names)]
    total = {n: Play("total") for n in names}
    for name in order:
        cells, first = [], None
        for run in names:
            play = runs[run].get(name)
            if play is None:
                cells.append(f" | {'-':>28}")
                continue
            first = play.checked if first is None and run == names[0] else first
            total[run].results["ok"] += play.checked
            total[run].results["skipped"] += play.results["skipped"]
            total[run].tasks += play.tasks
            total[run].seconds += play.seconds
            skipped, hosts = play.results["skipped"], len(play.hosts)
            cells.append(f" | {play.checked:7} {skipped:4} {play.tasks:5} {hosts:6} {play.seconds:4.0f}")
        last = runs[names[-1]].get(name)
        delta = (last.checked if last else 0) - (first or 0)
        lines.append(f"{name[:width]:{width}}" + "".join(cells) + f" | {delta:+8}")
    cells = [
        f" | {t.results['ok']:7} {t.results['skipped']:4} {t.tasks:5} {'':6} {t.seconds:4.0f}" for t in total.values()
    ]
    delta = total[names[-1]].results["ok"] - total[names[0]].results["ok"]
    lines.append(f"{'total':{width}}" + "".join(cells) + f" | {delta:+8}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--names", help="a name for each run, comma-separated (default: the folders' names)")
    args = parser.parse_args()
    names = args.names.split(",") if args.names else [r.name for r in args.runs]
    if len(names) != len(args.runs):
        parser.error("--names: one name per run")
    runs = {n: plays(load_events(r)) for n, r in zip(names, args.runs, strict=True)}
    if empty := [str(r) for n, r in zip(names, args.runs, strict=True) if not runs[n]]:
        parser.error(f"no play in the events of {', '.join(empty)} (a run's folder under .runs/?)")
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()

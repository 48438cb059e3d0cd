"""A no-op provision before and after a change, paired on one converged lab (issue 49 item 3): the same
`corectl provision` run alternately from a git worktree of an older commit and from this checkout, in the
order old new, new old, ... so that drift in the machine's load hits both alike. Prints each run's wall time
and control-host CPU, and the new/old ratio of the means and of the medians. Every run must pass unchanged.

    .venv/bin/python bench/noop_pair.py OLD_REV [--rounds 4] [--site build/bench/benchlab]

The lab: `make bench BENCH_ARGS="--sizes 3 --only noop --keep"` leaves the bench lab converged; remove it with
`corectl lab down --inventory build/bench/benchlab` afterwards. The runs use the default strategy
(CORECTL_ACCELERATOR=none), as the issue's measure does. The older commit's corectl runs from its worktree (its
src/ on PYTHONPATH, its playbooks and roles as the project root) with this checkout's virtual environment.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fleet import ROOT, Sample, changed_hosts, measure

from corectl.commands.runs import load_runs
from corectl.site import resolve_site

CORECTL = str(Path(sys.executable).parent / "corectl")


def noop(tree: Path, site: Path) -> tuple[Sample, str]:
    """One no-op provision with ``tree``'s corectl; refused if it failed or changed anything."""
    env = {"CORECTL_ACCELERATOR": "none", "PYTHONPATH": str(tree / "src")}
    sample = measure([CORECTL, "provision", "--inventory", str(site)], env, cwd=tree)
    record = load_runs(resolve_site(str(site), ROOT))[-1]
    if record.get("status") != "successful" or any(changed_hosts(record).values()):
        raise SystemExit(f"bench: the no-op from {tree} did not pass unchanged: {changed_hosts(record)}")
    return sample, str(record["id"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description="A no-op provision before and after a change, paired on one converged lab."
    )
    parser.add_argument("old", help="the older commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--site", type=Path, default=ROOT / "build" / "bench" / "benchlab")
    args = parser.parse_args()
    site = args.site.resolve()
    walls: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="corectl-pair-") as tmp:
        old_tree = Path(tmp) / "old"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old_tree), args.old], check=True
        )
        try:
            trees = {"old": old_tree, "new": ROOT}
            for round_ in range(args.rounds):
                for which in ("old", "new") if round_ % 2 == 0 else ("new", "old"):
                    sample, run = noop(trees[which], site)
                    walls[which].append(sample.wall)
                    print(f"  {which} round {round_ + 1}: {sample.wall:6.1f} s wall  {sample.cpu:5.1f} s CPU  {run}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)], check=False)
    mean = {k: statistics.fmean(v) for k, v in walls.items()}
    median = {k: statistics.median(v) for k, v in walls.items()}
    print(f"no-op wall, {args.old} (old) against this checkout (new), {args.rounds} rounds")
    for which in ("old", "new"):
        print(f"  {which}  " + "  ".join(f"{w:6.1f}" for w in walls[which]) + f"   mean {mean[which]:6.1f}")
    print(f"  new / old: means x{mean['new'] / mean['old']:.2f}, medians x{median['new'] / median['old']:.2f}")


if __name__ == "__main__":
    main()

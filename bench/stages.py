"""What a lever of the test suite saves (issue 45): one test stage run alternately in two variants in
this process, each in its own cgroup (tests/cpuacct.py), so that both see the same machine in the same
minutes; printed: each run's wall time and CPU (user + system of its processes and of its stand-in
containers), each variant's median and the ratio of B to A. A variant is an environment: the node
image molecule uses, and any other variable the stage reads.

    .venv/bin/python bench/stages.py --stage molecule:slurm --rounds 2 \\
        --a CORECTL_NODE_IMAGE=corectl-node:<old recipe> --b CORECTL_NODE_IMAGE=corectl-node:<new recipe>

An old recipe's image is built from that commit's tree (docs/testing.md, "Measuring a lever"). The bench
exits 1 when any run fails: a lever is only measured on a stage that still passes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import cpuacct  # noqa: E402  (tests/cpuacct.py)

BIN = Path(sys.executable).parent


def stage_argv(stage: str) -> list[str]:
    kind, _, what = stage.partition(":")
    if kind == "molecule":
        return [str(BIN / "molecule"), "test", "-s", what]
    if kind == "pytest":
        return [str(BIN / "pytest"), "-p", "no:cacheprovider", "-q", *what.split()]
    raise SystemExit(f"--stage {stage}: molecule:<scenario> or pytest:<args>")


def one_run(name: str, argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float, bool]:
    """(wall s, cpu s, passed) of one run."""
    group = cpuacct.StageCgroup(name)
    group.create()
    sampler = cpuacct.start_sampler()
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            group.wrap(argv), cwd=ROOT, stdout=out, stderr=out, env={**env, **group.env()}, check=False
        )
    wall = time.monotonic() - start
    sampler.stop.set()
    sampler.sample()
    return wall, group.usage(sampler).cpu, proc.returncode == 0


def variant(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"{pair}: NAME=value")
        env[key] = value
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--a", nargs="*", default=[], help="NAME=value for the baseline")
    parser.add_argument("--b", nargs="*", default=[], help="NAME=value for the variant")
    args = parser.parse_args()
    if not cpuacct.available():
        print("bench/stages.py needs a writable cgroup v1 cpuacct (root on this kind of machine)", file=sys.stderr)
        return 2
    argv = stage_argv(args.stage)
    base = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    results: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    failed = False
    logs = Path(tempfile.mkdtemp(prefix="bench-stages-"))
    for round_ in range(args.rounds):
        order = ("A", "B") if round_ % 2 == 0 else ("B", "A")  # alternate, so neither always runs second
        for which in order:
            with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:  # no plugin kept between runs
                env = {**base, "XDG_CACHE_HOME": cache, **variant(args.a if which == "A" else args.b)}
                name = f"bench-{os.getpid()}-{which.lower()}-{round_}"
                wall, cpu, ok = one_run(name, argv, env, logs / f"{name}.log")
            failed |= not ok
            results[which].append((wall, cpu))
            print(f"round {round_ + 1} {which}: wall {wall:7.1f} s  cpu {cpu:7.1f} s  {'ok' if ok else 'FAILED'}")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
    for k in ("A", "B"):
        spread = max(c for _, c in results[k]) - min(c for _, c in results[k])
        print(f"{k}: median wall {med[k][0]:7.1f} s  cpu {med[k][1]:7.1f} s  (cpu spread {spread:.1f} s)")
    print(f"B/A: wall {med['B'][0] / med['A'][0]:.2f}  cpu {med['B'][1] / med['A'][1]:.2f}  (logs: {logs})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What one run of the node health check costs with each SMART reader the stand-in nodes can use (issue 45):
the checker (roles/node_health/files/corectl-health-check, as Slurm's health program runs it every 30 s on
each lab DGX) on a simulated healthy DGX H100 on this machine (tests/integration/test_health_check.py's
SimNode: the stand-in tools of tests/standin on PATH), alternately with nvme_smart_command A and B in this
process, so both see the same machine in the same minutes. Printed: each round's CPU per checker run (user +
system of the checker and everything it started, from getrusage), each variant's median and B/A.

    .venv/bin/python bench/health_run.py --rounds 6 --runs 5
    .venv/bin/python bench/health_run.py --a-tree /tmp/old/tests/standin --a-nvme shell

A variant is a stand-in tree (default: this checkout's tests/standin; another commit's with `git archive
<commit> tests/standin | tar -x -C /tmp/old`) and a SMART reader: python, `gpu-sim nvme-smart-log {device}` (a
Python stand-in per drive, the lab's reader until session 31), or shell, `gpu-sim-nvme smart-log {device}`
(the shell stand-in the lab and molecule/gpu use now). Default: A python, B shell, both this checkout's tree.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from test_health_check import SimNode  # noqa: E402

from conftest import CHECKER_TOOLS, STANDIN  # noqa: E402

READERS = {
    "python": lambda tree: ["gpu-sim", "nvme-smart-log", "{device}"],
    "shell": lambda tree: [str(tree / "gpusim" / "gpu-sim-nvme"), "smart-log", "{device}", "--output-format=json"],
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_per_run(node: SimNode, runs: int) -> float:
    before = children_cpu()
    for _ in range(runs):
        result = node.check()
        if result.returncode != 0:
            raise SystemExit(f"the check failed on the healthy node:\n{result.stdout}{result.stderr}")
    return (children_cpu() - before) / runs


def sim_node(root: Path, tree: Path, reader: str) -> SimNode:
    """A simulated healthy DGX whose stand-in tools come from ``tree``, reading SMART logs with ``reader``."""
    root.mkdir()
    node = SimNode(root)  # described with this checkout's gpu-sim (which keeps the drives' SMART logs)
    for name, script in CHECKER_TOOLS.items():  # SimNode's wrappers, pointed at this variant's tree
        wrapper = node.bin / name
        wrapper.write_text(wrapper.read_text().replace(str(STANDIN / script), str(tree / script)))
    node.config["nvme_smart_command"] = READERS[reader](tree)
    return node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=5, help="checker runs per round and variant")
    for name, reader in (("a", "python"), ("b", "shell")):
        parser.add_argument(f"--{name}-tree", type=Path, default=STANDIN, help=f"variant {name.upper()}'s stand-ins")
        parser.add_argument(f"--{name}-nvme", choices=sorted(READERS), default=reader)
    args = parser.parse_args()
    variants = {"A": (args.a_tree.resolve(), args.a_nvme), "B": (args.b_tree.resolve(), args.b_nvme)}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
        nodes = {name: sim_node(Path(tmp) / name, *variant) for name, variant in variants.items()}
        try:
            for round_ in range(args.rounds):
                for name in variants if round_ % 2 == 0 else reversed(variants):
                    cpu[name].append(cpu_per_run(nodes[name], args.runs))
                    print(f"round {round_ + 1} {name}: {cpu[name][-1]:.3f} CPU-s per checker run", flush=True)
        finally:
            for node in nodes.values():
                node.close()
    for name, (tree, reader) in variants.items():
        print(f"{name}: median {statistics.median(cpu[name]):.3f} CPU-s per run  ({tree}, SMART reader {reader})")
    a, b = (statistics.median(cpu[name]) for name in variants)
    print(f"B/A: {b / a:.2f} of the CPU of a health check run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

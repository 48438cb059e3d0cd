"""NCCL all_reduce bus bandwidth (nccl-tests' all_reduce_perf), judged at the sweep's largest message: of the node's
GPUs (nccl), and of a pair of nodes over the fabric from inside a two-node Slurm job (nccl-pair). Each takes every
GPU for a minute: they run only when asked for by name (burn-in, validation), never in Slurm's periodic program."""

from __future__ import annotations

import os
import re
import shutil

from .core import CheckFailed, Node, Skip, needs_gpus

BUSBW_AVERAGE = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")
# one row of all_reduce_perf's table (srun --label may prefix "0: "): size, count, type, redop, root, then
# out-of-place time, algbw, busbw, #wrong
BUSBW_ROW = re.compile(r"^\s*(?:\d+:\s+)?(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s", re.M)


def largest_message_busbw(output: str) -> tuple[int, float] | None:
    """(size, out-of-place bus bandwidth) of the table's largest message: what the fabric sustains.
    The closing "Avg bus bandwidth" averages every size of the sweep, so it moves with -b/-e (a real
    8x H100 run over 128 MiB-4 GiB averages 439 GB/s while it holds 465-474 GB/s from 1 GiB)."""
    rows = [(int(size), float(busbw)) for size, busbw in BUSBW_ROW.findall(output)]
    return max(rows) if rows else None


def measured_busbw(output: str) -> tuple[float, str] | None:
    """The bus bandwidth to judge, and where it was read: the largest message's, else the average line's."""
    largest = largest_message_busbw(output)
    if largest is not None:
        size, busbw = largest
        return busbw, f" at {size / 2**30:g} GiB" if size >= 2**30 else f" at {size / 2**20:g} MiB"
    average = BUSBW_AVERAGE.search(output)
    return (float(average.group(1)), " (average)") if average else None


def all_reduce(node: Node, command: list[str], expected: int, tool: str) -> str:
    """Run an all_reduce_perf command line ({gpus}: the node's GPU count) and judge its bus bandwidth."""
    config = node.config
    needs_gpus(config)
    argv = [part.replace("{gpus}", str(config["gpu_count"])) for part in command]
    if not argv:
        raise Skip("no command set")
    if shutil.which(argv[0]) is None:
        raise Skip(f"{tool} is not installed ({argv[0]} not found)")
    result = node.run(*argv, timeout=float(config["nccl_timeout_s"]))
    found = measured_busbw(result.stdout)
    if result.rc != 0 or found is None:
        lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        raise CheckFailed(f"all_reduce_perf failed (rc {result.rc}): {lines[-1] if lines else 'no output'}")
    busbw, at = found
    if expected and busbw < expected:
        raise CheckFailed(f"bus bandwidth {busbw:.1f} GB/s{at} < expected {expected} GB/s")
    return f"bus bandwidth {busbw:.1f} GB/s{at}" + (f" (expected >= {expected} GB/s)" if expected else "")


def check_nccl(node: Node) -> str:
    config = node.config
    return all_reduce(node, config["nccl_command"], config["nccl_busbw_min_gbps"], "nccl-tests' all_reduce_perf")


def check_nccl_pair(node: Node) -> str:
    """The two nodes of this Slurm job over the fabric: nccl_pair_command (srun across the job's nodes)."""
    config = node.config
    nodes = os.environ.get("SLURM_JOB_NUM_NODES", "")
    if nodes != "2":
        raise Skip(f"runs inside a Slurm job of two nodes (this one: {nodes or 'no job'})")
    tool = "nccl-tests' all_reduce_perf"
    return all_reduce(node, config["nccl_pair_command"], config["nccl_pair_busbw_min_gbps"], tool)

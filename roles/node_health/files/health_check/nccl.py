"""NCCL all_reduce bus bandwidth of the node's GPUs (nccl-tests' all_reduce_perf), judged at the sweep's largest
message. It takes every GPU for a minute: it runs only when asked for by name (burn-in, validation), never in
Slurm's periodic health program."""

from __future__ import annotations

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


def check_nccl(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    gpus = str(config["gpu_count"])
    argv = [part.replace("{gpus}", gpus) for part in config["nccl_command"]]
    if not argv:
        raise Skip("nccl_command empty")
    if shutil.which(argv[0]) is None:
        raise Skip(f"nccl-tests' all_reduce_perf is not installed ({argv[0]} not found)")
    result = node.run(*argv, timeout=float(config["nccl_timeout_s"]))
    found = measured_busbw(result.stdout)
    if result.rc != 0 or found is None:
        lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        raise CheckFailed(f"all_reduce_perf failed (rc {result.rc}): {lines[-1] if lines else 'no output'}")
    busbw, at = found
    expected = config["nccl_busbw_min_gbps"]
    if expected and busbw < expected:
        raise CheckFailed(f"bus bandwidth {busbw:.1f} GB/s{at} < expected {expected} GB/s")
    return f"bus bandwidth {busbw:.1f} GB/s{at}" + (f" (expected >= {expected} GB/s)" if expected else "")

#!/usr/bin/python3
"""Stand-in for nccl-tests' all_reduce_perf (github.com/NVIDIA/nccl-tests), installed by the gpu-sim package
as /usr/bin/gpu-sim-all-reduce-perf. It prints the real tool's report (its layout follows the real 8x H100
run in tests/samples/all_reduce_perf.8xh100.nccl-tests-290.txt) for the simulated GPUs Slurm gave the job:
a bus bandwidth that grows with the message size towards the node's `nccl_busbw_gbps` (gpu-sim's
description; `gpu-sim fault nccl-slow` lowers it). Only -b, -e, -f and -g are read.

Started by srun as several tasks (one per node: nccl-tests built with MPI), the ranks meet over TCP on the job's
network as NCCL's bootstrap does: each sends rank 0 its node's peak, and rank 0 alone prints the report, for the
slowest node's peak bounded by the fabric (the node's ACTIVE InfiniBand ports at 97 % of their rate)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "gpusim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
HALF_SPEED_BYTES = 2**28  # the size at which the stand-in reaches half its peak (small messages are latency-bound)
LINK_EFFICIENCY = 0.97  # of an InfiniBand port's signalling rate that data gets
MEET_S = 120  # how long the ranks wait for each other


def fabric_gbps(state: dict) -> float:
    """What the node's ACTIVE InfiniBand ports carry, in GB/s."""
    ports = [p for p in state.get("ib_ports", []) if p.get("state") == "ACTIVE"]
    return sum(float(p.get("rate_gbps", 0)) for p in ports) / 8 * LINK_EFFICIENCY


def meet(peak: float, state: dict) -> float | None:
    """Under srun with several tasks: rank 0 gets every rank's peak and returns the pair's (None on other ranks)."""
    tasks = int(os.environ.get("SLURM_NTASKS", "1"))
    if tasks <= 1:
        return peak
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    port = 20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000
    own = min(peak, fabric_gbps(state))
    if rank == 0:
        peaks = [own]
        with socket.create_server(("", port)) as server:
            server.settimeout(MEET_S)
            for _ in range(tasks - 1):
                conn, _ = server.accept()
                with conn:
                    peaks.append(float(conn.recv(64).decode()))
        return min(peaks)
    listed = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    names = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True, text=True, check=True)
    first = names.stdout.split()[0]
    deadline = time.monotonic() + MEET_S
    while True:  # until rank 0 listens
        try:
            with socket.create_connection((first, port), timeout=5) as conn:
                conn.sendall(f"{own}".encode())
            return None
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def size(text: str) -> int:
    unit = UNITS.get(text[-1:].upper())
    return int(float(text[:-1]) * unit) if unit else int(text)


def main() -> int:
    parser = argparse.ArgumentParser(prog="all_reduce_perf")
    parser.add_argument("-b", "--minbytes", type=size, default=32 * 2**20)
    parser.add_argument("-e", "--maxbytes", type=size, default=32 * 2**20)
    parser.add_argument("-f", "--stepfactor", type=int, default=2)
    parser.add_argument("-g", "--ngpus", type=int, default=1)
    args, _ = parser.parse_known_args()
    state = gpusim.load()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = [g for g in state["gpus"] if g.get("present", True)]
    if visible is not None:
        wanted = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        gpus = [g for g in gpus if g["index"] in wanted]
    host = socket.gethostname().split(".")[0]
    if len(gpus) < args.ngpus:
        print(f"{host}: Test CUDA failure common.cu:1007 'invalid device ordinal'", flush=True)
        print(f" .. {host} pid {os.getpid()}: Test failure common.cu:1113")
        return 2
    peak = meet(float(state.get("nccl_busbw_gbps", gpusim.NCCL_BUSBW_GBPS)), state)
    if peak is None:
        return 0  # rank 0 prints the report
    print(
        f"# nThread 1 nGpus {args.ngpus} minBytes {args.minbytes} maxBytes {args.maxbytes} step: "
        f"{args.stepfactor}(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0"
    )
    print("#\n# Using devices")
    for rank, gpu in enumerate(gpus[: args.ngpus]):
        bus = gpu["pci_bus_id"].split(":")[-2].lower()
        pid = os.getpid()
        print(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {rank:2d} [0x{bus}] {state['model']}")
    print("#")
    print("#" + " " * 62 + "out-of-place" + " " * 23 + "in-place")
    print("#       size         count      type   redop    root" + "     time   algbw   busbw #wrong" * 2)
    print("#        (B)    (elements)" + " " * 31 + "(us)  (GB/s)  (GB/s)" + " " * 12 + "(us)  (GB/s)  (GB/s)")
    factor = 2 * (args.ngpus - 1) / args.ngpus if args.ngpus > 1 else 1.0  # busbw = algbw * 2(n-1)/n
    sizes, current = [], args.minbytes
    while current <= args.maxbytes:
        sizes.append(current)
        current *= max(2, args.stepfactor)
    total = 0.0
    for message in sizes:
        busbw = peak * message / (message + HALF_SPEED_BYTES)
        algbw = busbw / factor
        micros = message / (algbw * 1e3)
        total += busbw
        timing = f"  {micros:7.1f}  {algbw:6.2f}  {busbw:6.2f}      0"  # out of place, then in place
        print(f"{message:12d}  {message // 4:12d}     float     sum      -1{timing}{timing}")
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {total / max(1, len(sizes)):.3f}")
    print("#")
    return 0


if __name__ == "__main__":
    sys.exit(main())

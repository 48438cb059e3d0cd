"""The control host's CPU per added DGX of a node-local no-op (issue 49 item 1), measured on one bench lab.

`make bench` grows its lab from 1 to 4 DGX and measures each size once; there the service nodes' part (run from
this host, about 10 CPU-s, moving by a second or two between runs) is inside every figure and hides a slope of a
fraction of a second. This bench keeps the lab at its size and runs node-local no-ops limited to the head and the
first 1, 2, 4... DGX, in rotating order, ``--rounds`` times. Each run's record gives the control host's CPU of the
whole run and of its part run from here (the shard's control_cpu_s); their difference is the node jobs' part,
and its least-squares slope over the sizes is what the issue's target (0.25 CPU-s per DGX) is about. The whole
run's slope is printed beside it, then the last step alone (from 2 to 4 DGX: both followed by as many processes)
and the node-local wall projection of bench/fleet.py from these slopes (the node jobs' part as all of the control
host's CPU per node: the service nodes' part is once per run).

    .venv/bin/python bench/fleet.py --sizes 4 --only addnode --keep     # a converged bench lab, head + 4 DGX
    .venv/bin/python bench/nodelocal_slope.py [--sizes 1,2,4] [--rounds 2]

``--ssh-cpu``: also sum the CPU of every ssh client the run started (a shim first on PATH runs the real ssh under
bash's `times`), the part of the node jobs' CPU that is SSH's.

``--kex ALGORITHMS``: each size also run with cluster.yml's ssh.kex_algorithms set to ALGORITHMS (comma-separated),
beside the runs with OpenSSH's default key exchange, in the same rounds; each variant gets its slopes and the
ratio of its node jobs' part to the default's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet

SHIM = """#!/bin/bash
{ssh} "$@"
rc=$?
times >> {log}
exit $rc
"""


def ssh_seconds(log: Path) -> float:
    """The children's user + system seconds each shim wrote (bash `times`' second line), summed; the log emptied."""
    total = 0.0
    if log.is_file():
        lines = log.read_text().splitlines()
        for children in lines[1::2]:
            for part in children.split():
                minutes, seconds = part.rstrip("s").split("m")
                total += int(minutes) * 60 + float(seconds)
        log.unlink()
    return total


SSH_LINE = "  ssh: {user: root, key: .lab/id_ed25519}\n"  # as `corectl lab up` writes it


def with_kex(kex: str) -> None:
    """The bench lab's cluster.ssh with ``kex`` as its kex_algorithms ("": OpenSSH's default)."""
    path = fleet.SITE / "cluster.yml"
    lines = [line for line in path.read_text().splitlines(keepends=True) if not line.startswith("  ssh: {user: root")]
    at = next(i for i, line in enumerate(lines) if line.startswith("  ntp_servers:")) + 1
    lines.insert(at, SSH_LINE.replace("}", f", kex_algorithms: [{kex}]}}") if kex else SSH_LINE)
    path.write_text("".join(lines))


def one(dgx: int, env: dict[str, str], log: Path | None, kex: str = "") -> dict[str, Any]:
    limit = ",".join([f"{fleet.PREFIX}head01", *(f"{fleet.PREFIX}dgx{i:02d}" for i in range(1, dgx + 1))])
    with_kex(kex)
    fleet.with_sections(fleet.NODE_LOCAL)
    try:
        sample = fleet.corectl("provision", "--limit", limit, env=env)
    finally:
        fleet.with_sections()
        with_kex("")
    record = fleet.last_run()
    if record.get("status") != "successful" or any(fleet.changed_hosts(record).values()):
        raise SystemExit(f"bench: the {dgx}-DGX no-op did not pass unchanged: {fleet.changed_hosts(record)}")
    shards = record.get("shards") or []
    if len(shards) != dgx + 1:
        raise SystemExit(f"bench: the {dgx}-DGX no-op ran {len(shards)} parts, not {dgx + 1}: {shards}")
    here = sum(s.get("control_cpu_s") or 0.0 for s in shards if s["runner"] == "control host")
    own = (record.get("control_cpu_s") or {}).get("corectl", 0.0)
    row = {"kex": kex or "default", "dgx": dgx, "wall": sample.wall, "cpu": sample.cpu, "here": here}
    row |= {"nodes": sample.cpu - here, "own": own}
    row["services_s"], row["job_s"] = fleet.part_times(shards)
    if log is not None:
        row["ssh"] = ssh_seconds(log)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ssh-cpu", action="store_true")
    parser.add_argument("--kex", default="", help="cluster.ssh.kex_algorithms to run beside the default")
    options = parser.parse_args()
    sizes = [int(s) for s in options.sizes.split(",")]
    if not fleet.SITE.joinpath("cluster.yml").is_file():
        raise SystemExit(f"no bench lab at {fleet.SITE}: run bench/fleet.py with --keep first")
    env = {"CORECTL_ACCELERATOR": "mitogen"}
    with tempfile.TemporaryDirectory() as tmp:
        log = None
        if options.ssh_cpu:
            real = shutil.which("ssh")
            log = Path(tmp) / "ssh-times"
            shim = Path(tmp) / "bin" / "ssh"
            shim.parent.mkdir()
            shim.write_text(SHIM.format(ssh=real, log=log))
            shim.chmod(0o755)
            env["PATH"] = f"{shim.parent}:{os.environ['PATH']}"
        one(sizes[-1], env, log)  # a first run: the nodes' install up to date (not the steady state)
        rows: list[dict[str, Any]] = []
        ratios: list[float] = []
        kexes = ["", options.kex] if options.kex else [""]
        for number in range(options.rounds):
            order = sizes[number % len(sizes) :] + sizes[: number % len(sizes)]
            for dgx in order:
                pair: dict[str, dict[str, Any]] = {}
                for kex in kexes if number % 2 == 0 else kexes[::-1]:
                    row = pair[kex] = one(dgx, env, log, kex)
                    rows.append(row)
                    ssh = f"  ssh {row['ssh']:5.2f}" if "ssh" in row else ""
                    print(
                        f"  round {number + 1}  {row['kex'][:18]:18s} {dgx} DGX  wall {row['wall']:5.1f} s"
                        f"  CPU {row['cpu']:5.2f}  from here {row['here']:5.2f}  node jobs {row['nodes']:5.2f}"
                        f"  corectl's own {row['own']:5.2f}{ssh}",
                        flush=True,
                    )
                if options.kex:  # (each size's two variants, run one after the other)
                    ratios.append(pair[options.kex]["nodes"] / pair[""]["nodes"])
    parts = [("nodes", "node jobs' part"), ("cpu", "whole run"), ("own", "corectl's own process")]
    parts += [("ssh", "ssh clients")] if options.ssh_cpu else []
    for kex in kexes:
        mine = [r for r in rows if r["kex"] == (kex or "default")]
        print(f"key exchange {kex or 'default (OpenSSH)'}: per added DGX")
        for key, what in parts:
            print(f"  {what}: {fleet.slope([(r['dgx'], r[key]) for r in mine]):.3f} CPU-s")
        if len(sizes) > 1:  # the last step alone: both ends followed by the same number of processes
            low, high = sizes[-2:]
            step = [mean([r["nodes"] for r in mine if r["dgx"] == size]) for size in (low, high)]
            print(f"  node jobs' part from {low} to {high} DGX: {(step[1] - step[0]) / (high - low):.3f} CPU-s")
        biggest = [r for r in mine if r["dgx"] == sizes[-1]]
        for line in fleet.node_local_projection(
            round(mean([r["services_s"] for r in biggest]), 1),
            round(mean([r["job_s"] for r in biggest]), 1),
            fleet.slope([(r["dgx"], r["own"]) for r in mine]),
            fleet.slope([(r["dgx"], r["nodes"]) for r in mine]),
        ):
            print(f"  {line}" if line else "")
    if ratios:
        print(f"node jobs' part, {options.kex} / default: {sum(ratios) / len(ratios):.2f} (mean of {len(ratios)})")


if __name__ == "__main__":
    main()

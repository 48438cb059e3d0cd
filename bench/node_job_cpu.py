"""The control host's CPU of one node job, measured where it is spent (issue 49 item 1), against a bare SSH login.

bench/nodelocal_slope.py fits the node jobs' part of whole runs over 1, 2 and 4 DGX; that part is the run's CPU
less its service nodes' part, and moves by about 0.1 CPU-s per DGX between runs. This bench takes the parts that
grow with the nodes where they are spent, in one in-process node-local no-op of the bench lab's head + 4 DGX,
followed by two processes (corectl.ansible.remote.followers) of two jobs each:

- each job's thread in its follower (packing its own part, starting its ssh, reading its stream: time.thread_time
  around nodelocal._node), and the rest of each follower (its flusher, its wait, its start: getrusage of the whole
  process less its jobs' threads), which is once per follower, not per node;
- the ssh clients the followers started (getrusage of each follower's children as it ends);
- the run's own process while the node jobs run (getrusage around nodelocal._nodes: the events it is sent, the
  live display).

The baseline, in the same process and hour: one bare login to each DGX (`ssh ... true`, the argv and key exchange
of the node jobs' own ssh), ``--logins`` times each. A node job's CPU is printed as a ratio of it.

    .venv/bin/python bench/fleet.py --sizes 4 --only addnode --keep     # a converged bench lab, head + 4 DGX
    .venv/bin/python bench/node_job_cpu.py [--runs 3] [--kex curve25519-sha256]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet
from nodelocal_slope import with_kex

NODE_LOCAL = "node_local:\n  mode: 'on'\n  parallel: 4\n  processes: 2\n"


def cpu(who: int) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def instrument(out: Path) -> dict[str, float]:
    """Wrap the node-local run's parts (in this process, and in each follower as it is forked): each follower
    writes its figures to ``out``/<pid>.json as it ends; the run's process's part goes into the returned dict."""
    from corectl.ansible.remote import followers, nodelocal

    here: dict[str, float] = {}
    jobs: list[float] = []  # (each follower's own copy, after the fork)
    guard = threading.Lock()
    node, nodes, child = nodelocal._node, nodelocal._nodes, followers._child

    def timed_node(*args: Any) -> Any:
        start = time.thread_time()
        try:
            return node(*args)
        finally:
            with guard:
                jobs.append(time.thread_time() - start)

    def timed_nodes(*args: Any) -> Any:
        start = cpu(resource.RUSAGE_SELF)
        try:
            return nodes(*args)
        finally:
            here["run"] = cpu(resource.RUSAGE_SELF) - start

    def timed_child(*args: Any) -> None:
        jobs.clear()
        start = cpu(resource.RUSAGE_SELF)
        try:
            child(*args)
        finally:
            own, ssh = cpu(resource.RUSAGE_SELF) - start, cpu(resource.RUSAGE_CHILDREN)
            figures = {"jobs": len(jobs), "job_threads": sum(jobs), "own": own, "ssh": ssh}
            (out / f"{os.getpid()}.json").write_text(json.dumps(figures))

    nodelocal._node, nodelocal._nodes, followers._child = timed_node, timed_nodes, timed_child  # type: ignore[assignment]
    return here


def one_run(out: Path, here: dict[str, float]) -> dict[str, float]:
    from corectl.cli import app

    for stale in out.glob("*.json"):
        stale.unlink()
    fleet.with_sections(NODE_LOCAL)
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):  # (the run's display and summary)
            app(["provision", "--inventory", str(fleet.SITE)], standalone_mode=False)
    finally:
        fleet.with_sections()
    record = fleet.last_run()
    if record.get("status") != "successful" or any(fleet.changed_hosts(record).values()):
        raise SystemExit(f"bench: the no-op did not pass unchanged: {fleet.changed_hosts(record)}")
    groups = [json.loads(p.read_text()) for p in out.glob("*.json")]
    count = sum(g["jobs"] for g in groups)
    if len(groups) != 2 or count != 4:
        raise SystemExit(f"bench: expected 4 node jobs in 2 followers, got {groups}")
    return {
        "job_thread": sum(g["job_threads"] for g in groups) / count,
        "ssh": sum(g["ssh"] for g in groups) / count,
        "run": here["run"] / count,
        "follower_rest": mean(g["own"] - g["job_threads"] for g in groups),
    }


def logins(count: int) -> float:
    """CPU-s of one bare ssh login to a DGX of the bench lab, as the node jobs log in (mean over the DGX)."""
    from corectl.ansible.remote import nodelocal, runnerhost
    from corectl.bootstrap import key_path
    from corectl.site.loader import load_cluster

    site, cluster = fleet.bench_site(), load_cluster(fleet.SITE)
    key = key_path(site, cluster, "the bench logs in with it")
    dgx = [n for n in cluster.nodes if "dgx" in n.name]
    start = cpu(resource.RUSAGE_CHILDREN)
    for node in dgx:
        options = cluster.config.cluster.ssh.client_options(node.jump_host)
        argv = runnerhost.ssh_argv(site, nodelocal._endpoint(node), key, "true", options)
        for _ in range(count):
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return (cpu(resource.RUSAGE_CHILDREN) - start) / (count * len(dgx))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--logins", type=int, default=10, help="bare logins to each DGX for the baseline")
    parser.add_argument("--kex", default="", help="cluster.ssh.kex_algorithms (default: OpenSSH's own)")
    options = parser.parse_args()
    if not fleet.SITE.joinpath("cluster.yml").is_file():
        raise SystemExit(f"no bench lab at {fleet.SITE}: run bench/fleet.py with --keep first")
    os.environ["CORECTL_ACCELERATOR"] = "mitogen"  # (as the bench's other node-local runs)
    with_kex(options.kex)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            here = instrument(Path(tmp))
            one_run(Path(tmp), here)  # a first run: the nodes' install up to date (not the steady state)
            rows, bare = [], []
            for number in range(options.runs):
                bare.append(logins(options.logins))
                rows.append(one_run(Path(tmp), here))
                row = rows[-1]
                print(
                    f"  run {number + 1}: per node job: its thread {row['job_thread']:.3f}, its ssh {row['ssh']:.3f},"
                    f" the run's process {row['run']:.3f} CPU-s; per follower {row['follower_rest']:.3f};"
                    f" a bare login {bare[-1]:.4f}",
                    flush=True,
                )
    finally:
        with_kex("")
    job = {key: mean(r[key] for r in rows) for key in rows[0]}
    per_node = job["job_thread"] + job["ssh"] + job["run"]
    login = mean(bare)
    print(f"key exchange {options.kex or 'default (OpenSSH)'}; means of {options.runs} runs, CPU-s")
    print(f"  a bare ssh login to a DGX (the baseline)  {login:6.4f}  x {1:5.2f}")
    for key, what in (("job_thread", "a node job's thread"), ("ssh", "its ssh client"), ("run", "the run's process")):
        print(f"  {what:40s}  {job[key]:6.4f}  x {job[key] / login:5.2f}")
    print(f"  {'per node, the three':40s}  {per_node:6.4f}  x {per_node / login:5.2f}")
    print(f"  {'per follower process, once':40s}  {job['follower_rest']:6.4f}  x {job['follower_rest'] / login:5.2f}")


if __name__ == "__main__":
    main()

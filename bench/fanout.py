"""What one shard costs when a corectl run goes through ansible-runner's remote execution (issue 15).

The no-op provision of a converged site (`make lab` first) is run two ways, alternated --rounds
times in this process:

  direct   corectl's run_playbook, as every command runs today;
  stream   the same run packed by corectl.ansible.remote.jobpack (project, site files, vaulted secrets, the vault
           password in the stream only), `transmit` piped into `ansible-runner worker --delete`
           on this machine as a runner host would run it (the SSH hop to a runner is not in these
           figures), and `process` turning the worker's output back into events here.

Printed: wall time and CPU seconds (this process and everything it waited for) of each, the
ratio of the best stream to the best direct run, and the packed job's size. The bench exits 1
when the two ways disagree on any host's ok/changed/failed/skipped counts, when a run changed
something (the site was not converged), or when the worker's directory outlived its job.

    .venv/bin/python bench/fanout.py [--inventory lab] [--rounds 2] [--limit PATTERN]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any

from corectl.ansible.events import HostStats, RunRequest, stats_from_event
from corectl.ansible.remote.jobpack import RunnerSide, pack, run_streamed
from corectl.ansible.runner import run_playbook
from corectl.secrets import SecretFiles, vault_password
from corectl.site import Site, resolve_site

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# the worker's directory: in memory (ansible-runner writes the vault password to env/passwords
# there for the length of the job), removed by --delete when the job ends
WORKER_BASE = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def cpu_seconds() -> float:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def direct(request: RunRequest) -> tuple[float, float, dict[str, HostStats]]:
    wall, cpu = time.monotonic(), cpu_seconds()
    result = run_playbook(request)
    return time.monotonic() - wall, cpu_seconds() - cpu, result.hosts


def stream(request: RunRequest, base: Path, password: str) -> tuple[float, float, dict[str, HostStats], int, bool]:
    """(wall, cpu, per-host stats, packed bytes, worker directory removed) of one streamed run."""
    site = request.site
    job = secrets.token_hex(4)
    worker_dir = WORKER_BASE / f"corectl-job-{job}"
    runner = RunnerSide(
        remote_dir=PurePosixPath(worker_dir),
        fact_cache=PurePosixPath(base / "runner-facts"),
        ssh_key=str(site.lab_dir / "id_ed25519") if (site.lab_dir / "id_ed25519").is_file() else None,
    )
    stats: dict[str, HostStats] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "playbook_on_stats":
            stats.update(stats_from_event(event.get("event_data", {})))

    wall, cpu = time.monotonic(), cpu_seconds()
    packed = base / f"packed-{job}"
    kwargs = pack(request, packed, f"bench-{job}", runner, password)
    worker = [str(BIN / "ansible-runner"), "worker", "--private-data-dir", str(worker_dir), "--delete"]
    status = run_streamed(kwargs, worker, base / f"processed-{job}", on_event).status
    elapsed, used = time.monotonic() - wall, cpu_seconds() - cpu
    size = sum(f.stat().st_size for f in packed.rglob("*") if f.is_file())
    if status not in ("successful", "failed"):
        raise SystemExit(f"bench: the streamed run ended {status}")
    return elapsed, used, stats, size, not worker_dir.exists()


def counts(hosts: dict[str, HostStats]) -> dict[str, dict[str, int]]:
    keep = ("ok", "changed", "failed", "unreachable", "skipped")
    return {host: {k: v for k, v in asdict(stats).items() if k in keep} for host, stats in sorted(hosts.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", default="lab", help="a converged site (default: the lab)")
    parser.add_argument("--rounds", type=int, default=2, help="direct/stream pairs, alternated")
    parser.add_argument("--limit", help="Ansible host pattern (the shard)")
    args = parser.parse_args()
    site: Site = resolve_site(args.inventory, ROOT)
    request = RunRequest(site=site, command="bench fanout", limit=args.limit)
    password = vault_password(SecretFiles(site)).decode()
    problems: list[str] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="corectl-fanout-") as tmp:
        # the runner's fact cache as after its first job (warm, like the site's): a cold one
        # gathers facts once more per host and the counts would differ by that task
        if site.facts_dir.is_dir():
            shutil.copytree(site.facts_dir, Path(tmp) / "runner-facts")
        for _ in range(args.rounds):
            wall, cpu, by_direct = direct(request)
            rows.append({"way": "direct", "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)})
            wall, cpu, by_stream, size, removed = stream(request, Path(tmp), password)
            rows.append({"way": "stream", "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "packed_bytes": size})
            if counts(by_direct) != counts(by_stream):
                problems.append(f"per-host results differ: {counts(by_direct)} / {counts(by_stream)}")
            if not by_stream or any(s.changed or s.failed or s.unreachable for s in by_stream.values()):
                problems.append(f"not a converged no-op: {counts(by_stream)}")
            if not removed:
                problems.append("the worker's directory outlived its job")
    best = {way: min(r["wall_s"] for r in rows if r["way"] == way) for way in ("direct", "stream")}
    report = {
        "site": site.name,
        "limit": args.limit,
        "hosts": counts(by_stream),
        "rows": rows,
        "stream_over_direct": round(best["stream"] / best["direct"], 2),
        "overhead_s": round(best["stream"] - best["direct"], 1),
        "problems": problems,
    }
    print(f"no-op provision of {site.name} ({len(by_stream)} hosts), {args.rounds} rounds alternated")
    for row in rows:
        extra = f"   packed job {row['packed_bytes'] / 1e6:.2f} MB" if "packed_bytes" in row else ""
        print(f"  {row['way']:<7} {row['wall_s']:7.1f} s wall {row['cpu_s']:7.1f} CPU-s{extra}")
    print(f"  best stream / best direct: x{report['stream_over_direct']} ({report['overhead_s']:+.1f} s)")
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    out = ROOT / "build" / "bench-fanout.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    # ansible-playbook and ansible-runner of this interpreter's environment, on both sides
    os.environ["PATH"] = os.pathsep.join([str(BIN), os.environ.get("PATH", "")])
    sys.exit(main())

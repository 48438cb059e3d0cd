"""health --burn-in: NCCL all_reduce bus bandwidth per node, through Slurm (playbooks/burn-in.yml); a node
that fails is drained with the figure in its reason."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from corectl import ansible, slurm
from corectl.ansible import RunRequest
from corectl.ansible.progress import LiveProgress, TaskResults
from corectl.site import Site
from corectl.site.inventory import render_site

BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")
# one row of all_reduce_perf's table (srun --label may prefix "0: "): size, count, type, redop, root, then
# out-of-place time, algbw, busbw, #wrong
ROW = re.compile(r"^\s*(?:\d+:\s+)?(\d+)\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s", re.M)


def largest_message_busbw(output: str) -> tuple[int, float] | None:
    """(size, out-of-place bus bandwidth) of the table's largest message: what the fabric sustains.
    The closing "Avg bus bandwidth" averages every size of the sweep, so it moves with -b/-e (a real
    8x H100 run over 128 MiB-4 GiB averages 439 GB/s while it holds 465-474 GB/s from 1 GiB)."""
    rows = [(int(size), float(busbw)) for size, busbw in ROW.findall(output)]
    return max(rows) if rows else None


def measured(output: str) -> tuple[float, str] | None:
    """The bus bandwidth to judge, and where it was read: the largest message's, else the average line's."""
    largest = largest_message_busbw(output)
    if largest is not None:
        size, busbw = largest
        return busbw, f" at {size / 2**30:g} GiB" if size >= 2**30 else f" at {size / 2**20:g} MiB"
    average = BUSBW.search(output)
    return (float(average.group(1)), " (average)") if average else None


@dataclass(frozen=True)
class BurnIn:
    node: str
    status: str  # pass | fail | skip
    busbw_gbps: float | None
    expected_gbps: float
    message: str
    drained_for: str = ""  # the reason the node was drained for before (run through a reservation)


def judge(raw: dict) -> BurnIn:
    """One node's verdict from what the playbook saved."""
    node, expected = raw["node"], float(raw.get("expected_gbps") or 0)
    before = str(raw.get("drained_for") or "")
    if not raw.get("gpus"):
        return BurnIn(node, "skip", None, expected, "no GPUs in the node's profile")
    if not raw.get("tool"):
        return BurnIn(node, "skip", None, expected, "nccl-tests' all_reduce_perf is not installed on the node")
    output = raw.get("output") or ""
    found = measured(output)
    if raw.get("rc") != 0 or found is None:
        lines = [line for line in output.splitlines() if line.strip()]
        message = f"all_reduce_perf failed (rc {raw.get('rc')}): {lines[-1] if lines else ''}"
        return BurnIn(node, "fail", None, expected, message, before)
    busbw, at = found
    if expected and busbw < expected:
        message = f"bus bandwidth {busbw:.1f} GB/s{at} < expected {expected:.0f} GB/s"
        return BurnIn(node, "fail", busbw, expected, message, before)
    return BurnIn(node, "pass", busbw, expected, f"drained again: {before}" if before else "", before)


REASON_MAX = 250  # characters of a drain reason (Slurm keeps more; sinfo and squeue show far less)
RESULT_TASK = "Record the node's burn-in result"  # playbooks/burn-in.yml: its fact is the node's result


def burn_in(site: Site, console: Console, *, limit: str | None = None) -> list[BurnIn]:
    cluster, _ = render_site(site, check_only=False)
    request = RunRequest(
        site=site,
        playbook="burn-in.yml",
        command="health --burn-in",
        limit=limit or "compute",  # the play's hosts: a fanned-out run then has no shard of service nodes
        secrets=False,
    )
    with LiveProgress(console, f"burn-in {site.name}") as progress:
        recorded = TaskResults(RESULT_TASK, progress)
        ansible.run(request, recorded, cluster=cluster)
    facts = {host: res.get("ansible_facts") or {} for host, res in sorted(recorded.by_host.items())}
    results = [judge(fact["burn_in_result"]) for fact in facts.values() if "burn_in_result" in fact]
    table = Table(title="burn-in: NCCL all_reduce bus bandwidth")
    for column in ("node", "result", "busbw GB/s", "expected", "note"):
        table.add_column(column)
    for r in results:
        style = {"fail": "red", "skip": "yellow"}.get(r.status)
        busbw = f"{r.busbw_gbps:.1f}" if r.busbw_gbps is not None else "-"
        table.add_row(
            r.node, r.status, busbw, f"{r.expected_gbps:.0f}" if r.expected_gbps else "-", r.message, style=style
        )
    console.print(table)
    failed = [r for r in results if r.status == "fail"]
    for r in failed:  # one run each: every node's reason has its own figure
        slurm.state_run(site, cluster, console, [r.node], "drain", drain_reason(r))
    return results


def drain_reason(result: BurnIn) -> str:
    """What Slurm shows for a node that failed its burn-in (and why it was drained before, if it was)."""
    before = f" (drained before: {result.drained_for})" if result.drained_for else ""
    return f"corectl burn-in: {result.message}{before}"[:REASON_MAX]

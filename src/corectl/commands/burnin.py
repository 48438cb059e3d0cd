"""health --burn-in: NCCL all_reduce bus bandwidth per node, through Slurm (playbooks/burn-in.yml)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from corectl import ansible
from corectl.ansible import RunRequest
from corectl.ansible.progress import LiveProgress, TaskResults
from corectl.site import Site
from corectl.site.inventory import render_site

BUSBW = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.]+)")


@dataclass(frozen=True)
class BurnIn:
    node: str
    status: str  # pass | fail | skip
    busbw_gbps: float | None
    expected_gbps: float
    message: str


def judge(raw: dict) -> BurnIn:
    """One node's verdict from what the playbook saved."""
    node, expected = raw["node"], float(raw.get("expected_gbps") or 0)
    if not raw.get("gpus"):
        return BurnIn(node, "skip", None, expected, "no GPUs in the node's profile")
    if not raw.get("tool"):
        return BurnIn(node, "skip", None, expected, "nccl-tests' all_reduce_perf is not installed on the node")
    found = BUSBW.search(raw.get("output") or "")
    if raw.get("rc") != 0 or not found:
        lines = [line for line in (raw.get("output") or "").splitlines() if line.strip()]
        return BurnIn(
            node, "fail", None, expected, f"all_reduce_perf failed (rc {raw.get('rc')}): {lines[-1] if lines else ''}"
        )
    busbw = float(found.group(1))
    if expected and busbw < expected:
        return BurnIn(node, "fail", busbw, expected, f"bus bandwidth {busbw:.1f} GB/s < expected {expected:.0f} GB/s")
    return BurnIn(node, "pass", busbw, expected, "")


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
    return results

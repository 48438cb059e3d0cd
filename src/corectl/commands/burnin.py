"""health --burn-in: the health checker's nccl check (NCCL all_reduce bus bandwidth) on each node through Slurm
(playbooks/burn-in.yml); a node that fails is drained with the figure in its reason."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from corectl import ansible, slurm
from corectl.ansible import Returned, RunRequest
from corectl.drain_reason import DrainReason
from corectl.progress import LiveProgress
from corectl.site.context import Context

CHECK = "nccl"  # the checker's check the burn-in job runs (roles/node_health/files/health_check/nccl.py)


@dataclass(frozen=True)
class BurnIn:
    node: str
    status: str  # pass | fail | skip
    message: str
    drained_for: str = ""  # the reason the node was drained for before (run through a reservation)


def last_line(*texts: str) -> str:
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def judge(raw: dict) -> BurnIn:
    """One node's verdict from what the playbook saved: the checker's --json report of its nccl check."""
    node, before = raw["node"], str(raw.get("drained_for") or "")
    if not raw.get("gpus"):
        return BurnIn(node, "skip", "no GPUs in the node's profile")
    stdout, stderr = str(raw.get("stdout") or ""), str(raw.get("stderr") or "")
    try:
        report = json.loads(stdout)
    except ValueError:
        report = None
    checks = report.get("checks") if isinstance(report, dict) else None
    check = next((c for c in checks or [] if isinstance(c, dict) and c.get("name") == CHECK), None)
    if check is None:  # srun could not start it, or the checker could not run
        return BurnIn(
            node, "fail", f"the {CHECK} check did not run (rc {raw.get('rc')}): {last_line(stdout, stderr)}", before
        )
    status, message = str(check.get("status")), str(check.get("message") or "")
    if status == "skip":
        return BurnIn(node, "skip", message)
    if status == "pass":
        return BurnIn(node, "pass", f"{message}; drained again: {before}" if before else message, before)
    return BurnIn(node, "fail", message, before)  # fail, or interrupted (the job was cancelled)


RETURNED = "corectl_burn_in"  # playbooks/burn-in.yml hands each node's result back under it


def burn_in(ctx: Context, console: Console, *, limit: str | None = None) -> list[BurnIn]:
    site, cluster = ctx.site, ctx.rendered()
    request = RunRequest.of(
        ctx,
        playbook="burn-in.yml",
        command="health --burn-in",
        limit=limit or "compute",  # the play's hosts: a fanned-out run then has no shard of service nodes
        secrets=False,
        # a drained node whose reason the play could not read is drained again with this one
        extravars={"corectl_burn_in_unknown_reason": str(DrainReason.burn_in("drained before it"))},
    )
    with LiveProgress(console, f"burn-in {site.name}") as progress:
        recorded = Returned(RETURNED, progress)
        ansible.run(request, recorded, cluster=cluster)
    results = [judge(result) for _, result in sorted(recorded.by_host.items()) if isinstance(result, dict)]
    table = Table(title="burn-in: NCCL all_reduce bus bandwidth (the nccl check)")
    for column in ("node", "result", "message"):
        table.add_column(column)
    for r in results:
        style = {"fail": "red", "skip": "yellow"}.get(r.status)
        table.add_row(r.node, r.status, r.message, style=style)
    console.print(table)
    failed = [r for r in results if r.status == "fail"]
    for r in failed:  # one run each: every node's reason has its own figure
        slurm.state_run(ctx, console, [r.node], "drain", drain_reason(r))
    return results


def drain_reason(result: BurnIn) -> str:
    """What Slurm shows for a node that failed its burn-in (and why it was drained before, if it was)."""
    before = f" (drained before: {result.drained_for})" if result.drained_for else ""
    return str(DrainReason.burn_in(f"{result.message}{before}"))

"""validate-nodes: a validation round now, through Slurm: role slurm's corectl-validate on the controller
(playbooks/validate-nodes.yml) submits the health checker's dcgm-diag and nccl checks as jobs of the validation
QOS and waits for them; a node that fails was drained by its own job, with the check and figure in its reason."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from corectl import ansible
from corectl.ansible import Returned, RunRequest
from corectl.errors import CorectlError
from corectl.progress import LiveProgress
from corectl.site.context import Context
from corectl.slurm import compute_names

RETURNED = "corectl_validate"  # playbooks/validate-nodes.yml hands the round's answer back under it
FAILED = ("fail", "error", "suspect")


@dataclass(frozen=True)
class Validated:
    node: str
    result: str  # pass | fail | preempted | skipped | error; the pairwise round: suspect | untested
    job: str
    message: str


def validate_nodes(ctx: Context, console: Console, nodes: str | None, pairwise: bool = False) -> list[Validated]:
    site, cluster = ctx.site, ctx.rendered()
    if cluster.config.health.validation is None:
        why = "health.validation is not set (the validation QOS and program exist only with it)"
        raise CorectlError(f"{site.cluster_file}: {why}", exit_code=2)
    names = compute_names(ctx, nodes) if nodes else []
    controller = cluster.with_role("slurm_controller")[0].name
    request = RunRequest.of(
        ctx,
        playbook="validate-nodes.yml",
        command="validate-nodes" + (" --pairwise" if pairwise else ""),
        limit=controller,
        extravars={"corectl_validate_nodes": ",".join(names), "corectl_validate_pairwise": pairwise},
        secrets=False,
        fan_out=False,
    )
    with LiveProgress(console, f"validate-nodes {site.name}") as progress:
        recorded = Returned(RETURNED, progress)
        ansible.run(request, recorded, cluster=cluster)
    res = recorded.by_host.get(controller) or {}
    if res.get("rc") not in (0, 1):  # 0: every node passed, 1: a node failed; else the program could not run
        said = recorded.unreachable.get(controller) or res.get("stderr") or res.get("msg") or "no result"
        raise CorectlError(f"validation round on {controller} failed: {str(said).strip()}")
    rows = json.loads(res.get("stdout") or "[]")
    results = [Validated(r["node"], r["result"], r.get("job", ""), r.get("message", "")) for r in rows]
    console.print(table(results, pairwise))
    return results


def table(results: list[Validated], pairwise: bool = False) -> Table:
    what = "NCCL all_reduce and ib_write_bw between pairs of nodes" if pairwise else "dcgmi diag and NCCL all_reduce"
    shown = Table(title=f"validation: {what} as Slurm jobs of the validation QOS")
    for column in ("node", "result", "job", "message"):
        shown.add_column(column)
    for r in results:
        style = "red" if r.result in FAILED else "yellow" if r.result in ("preempted", "skipped", "untested") else None
        shown.add_row(r.node, r.result, r.job or "-", r.message, style=style)
    return shown

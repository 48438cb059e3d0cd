"""upgrade drivers: a rolling, drain-aware NVIDIA driver upgrade of the GPU nodes, batch by batch.

The target version is the one in group_vars (nvidia_driver_version); provision refuses to change a
running driver, so this is the only way a node gets a new one. Idle nodes go first; a node with
running jobs is drained and waited for (no job is killed); the rollout stops at the first batch
that fails, leaving the remaining nodes untouched.
"""

from __future__ import annotations

from rich.console import Console

from corectl import ansible, hostlist, secrets
from corectl.ansible import RunRequest, RunResult
from corectl.errors import CorectlError
from corectl.progress import LiveProgress, summary_table
from corectl.site.context import Context
from corectl.slurm import read_slurm_status


def rollout_order(nodes: list[str], busy: set[str]) -> list[str]:
    """Idle nodes first (they are done while the busy ones finish their jobs), each group in name order."""
    return [n for n in nodes if n not in busy] + [n for n in nodes if n in busy]


def batches(nodes: list[str], size: int) -> list[list[str]]:
    return [nodes[i : i + size] for i in range(0, len(nodes), size)]


def upgrade_drivers(
    ctx: Context, console: Console, *, batch: int, timeout: int, limit: str | None = None
) -> list[RunResult]:
    if batch < 1:
        raise CorectlError("--batch must be at least 1", exit_code=2)
    site, cluster = ctx.site, ctx.rendered()
    nodes = [n.name for n in cluster.with_gpus()]
    if limit:
        try:
            wanted = set(hostlist.expand(limit))
        except hostlist.HostlistError as exc:
            raise CorectlError(f"--limit: {exc}", exit_code=2) from None
        unknown = sorted(wanted - set(nodes))
        if unknown:
            raise CorectlError(f"not GPU nodes of site {site.name}: {', '.join(unknown)}", exit_code=2)
        nodes = [n for n in nodes if n in wanted]
    if not nodes:
        raise CorectlError(f"site {site.name} has no GPU nodes", exit_code=2)
    secrets.check(site)
    status = read_slurm_status(ctx)
    order = rollout_order(nodes, status.busy_nodes())
    results: list[RunResult] = []
    plan = batches(order, batch)
    for index, members in enumerate(plan, start=1):
        names = hostlist.compress(members)
        console.print(f"batch {index}/{len(plan)}: {names}", highlight=False)
        request = RunRequest.of(
            ctx,
            playbook="upgrade-drivers.yml",
            command=f"upgrade drivers {names}",
            limit=",".join(members),
            extravars={"corectl_upgrade_timeout": timeout},
        )
        with LiveProgress(console, f"upgrade drivers {names}") as progress:
            result = ansible.run(request, progress, cluster=cluster)  # fanned out when the site has runners
        console.print(summary_table(result))
        results.append(result)
        if not result.ok:
            left = [n for later in plan[index:] for n in later]
            rest = f"; not started: {hostlist.compress(left)}" if left else ""
            failed = ", ".join(result.failed_hosts) or result.status
            raise CorectlError(f"upgrade drivers stopped at batch {index} ({failed}){rest}")
    return results

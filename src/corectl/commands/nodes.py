"""drain, resume: Slurm node state, set on the controller through the site's inventory."""

from __future__ import annotations

from rich.console import Console

from corectl import hostlist
from corectl.commands.inventory import render_site
from corectl.errors import CorectlError
from corectl.model import Cluster
from corectl.progress import LiveProgress, summary_table
from corectl.runner import RunRequest, RunResult, run_playbook
from corectl.site import Site


def compute_names(site: Site, cluster: Cluster, expr: str, what: str = "NODE") -> list[str]:
    """The compute nodes a host list names; a malformed list or another node: a one-line error."""
    try:
        names = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        raise CorectlError(f"{what}: {exc}", exit_code=2) from None
    computes = {n.name for n in cluster.nodes if "compute" in n.roles}
    unknown = [name for name in names if name not in computes]
    if unknown:
        raise CorectlError(f"not compute nodes of site {site.name}: {', '.join(unknown)}", exit_code=2)
    return names


def set_state(site: Site, console: Console, nodes: str, state: str, reason: str | None = None) -> RunResult:
    cluster, _ = render_site(site, check_only=False)
    names = compute_names(site, cluster, nodes)
    if state == "drain" and not (reason and reason.strip()):
        raise CorectlError("a drain needs --reason (Slurm shows it to users and operators)", exit_code=2)
    result = state_run(site, cluster, console, names, state, reason)
    console.print(summary_table(result))
    return result


def state_run(
    site: Site,
    cluster: Cluster,
    console: Console,
    names: list[str],
    state: str,
    reason: str | None = None,
    only_reason: str | None = None,
) -> RunResult:
    """Drain (with ``reason``) or resume ``names`` on the controller; ``only_reason``: resume only
    nodes whose reason starts with it."""
    controller = cluster.with_role("slurm_controller")[0].name
    extravars = {"corectl_state_nodes": hostlist.compress(names), "corectl_state": state}
    if reason:
        extravars["corectl_state_reason"] = reason.strip()
    if only_reason:
        extravars["corectl_state_only_reason"] = only_reason
    request = RunRequest(
        site=site,
        playbook="node-state.yml",
        command=f"{state} {hostlist.compress(names)}",
        limit=controller,
        extravars=extravars,
        secrets=False,
    )
    with LiveProgress(console, f"{state} {site.name}") as progress:
        return run_playbook(request, sink=progress)

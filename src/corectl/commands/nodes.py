"""drain, resume: Slurm node state, set on the controller through the site's inventory."""

from __future__ import annotations

from rich.console import Console

from corectl import hostlist
from corectl.commands.inventory import render_site
from corectl.errors import CorectlError
from corectl.progress import LiveProgress, summary_table
from corectl.runner import RunRequest, RunResult, run_playbook
from corectl.site import Site


def set_state(site: Site, console: Console, nodes: str, state: str, reason: str | None = None) -> RunResult:
    cluster, _ = render_site(site, check_only=False)
    try:
        names = hostlist.expand(nodes)
    except hostlist.HostlistError as exc:
        raise CorectlError(f"NODE: {exc}", exit_code=2) from None
    computes = {n.name for n in cluster.nodes if "compute" in n.roles}
    unknown = [name for name in names if name not in computes]
    if unknown:
        raise CorectlError(f"not compute nodes of site {site.name}: {', '.join(unknown)}", exit_code=2)
    if state == "drain" and not (reason and reason.strip()):
        raise CorectlError("a drain needs --reason (Slurm shows it to users and operators)", exit_code=2)
    controller = cluster.with_role("slurm_controller")[0].name
    extravars = {"corectl_state_nodes": hostlist.compress(names), "corectl_state": state}
    if reason:
        extravars["corectl_state_reason"] = reason.strip()
    request = RunRequest(
        site=site,
        playbook="node-state.yml",
        command=f"{state} {hostlist.compress(names)}",
        limit=controller,
        extravars=extravars,
        secrets=False,
    )
    with LiveProgress(console, f"{state} {site.name}") as progress:
        result = run_playbook(request, sink=progress)
    console.print(summary_table(result))
    return result

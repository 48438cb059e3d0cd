"""add-node and remove-node: change the cluster by one node, touching only what must change.

add-node: declare the node (unless cluster.yml already does), then
  0. the new node alone, changing nothing: its Slurm release against the controller's (refused:
     cluster.yml as it was before),
  1. the other nodes: only the node list (tag node_list: /etc/hosts and the firewall's addresses),
  2. the controller, login and monitoring nodes: Slurm configuration and Prometheus targets
     (tags slurm, monitoring), then drain the new node in Slurm before its slurmd ever starts,
  3. the other compute nodes: slurmd restarted with the new node list (Slurm before 24.11 needs
     it; running jobs go on), the same change the next provision would otherwise make,
  4. the new node: the whole site playbook,
  5. the new node's health checks; only when they pass is it resumed.
remove-node: drain it and wait for its jobs, remove it from cluster.yml, then update the
controller, login and monitoring nodes, the remaining compute nodes' slurmd and the other
nodes' /etc/hosts.
Both end with the cluster converged: a provision right after either changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from corectl import ansible, hostlist, secrets
from corectl.ansible import RunRequest, RunResult
from corectl.ansible.records import expected_from_history
from corectl.bootstrap import Login
from corectl.bootstrap import bootstrap_nodes as bootstrap
from corectl.errors import CorectlError
from corectl.files import atomic_write
from corectl.health.report import health
from corectl.progress import LiveProgress, summary_table
from corectl.site import Site, edit
from corectl.site.context import Context
from corectl.site.model import Cluster
from corectl.slurm import set_state

ADD_REASON = "corectl add-node: not yet checked"


def _step(site: Site, console: Console, title: str, *, check: bool = True, **request: Any) -> RunResult:
    """One playbook run of a node change; a failed one raises (``check=False``: returned, for the caller)."""
    console.print(f"[bold]{title}[/bold]")
    run = RunRequest(site=site, **request)
    with LiveProgress(
        console, title, expected_from_history(site, run.command, run.playbook, tags=run.tags)
    ) as progress:
        result = ansible.run(run, progress)
    console.print(summary_table(result))
    if check and not result.ok:
        raise _failed(title, result)
    return result


def _failed(title: str, result: RunResult) -> CorectlError:
    failed = ", ".join(result.failed_hosts) or result.status
    return CorectlError(f"{title}: failed on {failed}; see {result.artifact_dir}")


def _check_slurm_release(ctx: Context, console: Console, name: str, before: bytes | None) -> None:
    """Before any other node changes: the new node's Slurm release against the cluster's
    (playbooks/slurm-versions.yml). Refused: the node leaves cluster.yml again when add-node put it there."""
    title = f"add-node {name}: its Slurm release against the cluster's"
    site = ctx.site
    result = _step(
        site, console, title, check=False,
        command=f"add-node {name} (slurm versions)", playbook="slurm-versions.yml", limit=name, secrets=False,
    )  # fmt: skip
    if result.ok:
        return
    refusals = [result.messages.get(h, "") for h in result.failed_hosts if not result.hosts[h].unreachable]
    if not refusals:  # unreachable, or no answer: like any other step's failure
        raise _failed(title, result)
    if before is not None:
        atomic_write(site.cluster_file, before)
        ctx.reload()
        console.print(f"{site.cluster_file}: {name} taken out again")
    raise CorectlError("; ".join(refusals))


def _service_nodes(cluster: Cluster, exclude: str) -> str:
    """Hosts whose configuration lists the nodes: controllers, login and monitoring nodes."""
    names = {n.name for n in cluster.nodes if {"slurm_controller", "login", "monitoring"} & set(n.roles)}
    names |= {cluster.config.slurm.backup_controller} - {None}
    names.discard(exclude)
    return ",".join(sorted(names))


def _update_config(site: Site, console: Console, cluster: Cluster, verb: str, name: str) -> None:
    """Slurm's configuration and Prometheus' targets on the hosts that hold them."""
    _step(
        site,
        console,
        f"{verb} {name}: Slurm and Prometheus configuration",
        command=f"{verb} {name} (config)",
        limit=_service_nodes(cluster, name),
        tags="slurm,monitoring",
    )


def _update_hosts(site: Site, console: Console, verb: str, name: str, hosts: list[str]) -> None:
    """Only the node list on ``hosts``: /etc/hosts and the firewall's allowed addresses."""
    _step(
        site, console, f"{verb} {name}: the node list on the other nodes", command=f"{verb} {name} (hosts)",
        limit=",".join(hosts), tags="node_list",
    )  # fmt: skip


def _update_slurmd(site: Site, console: Console, cluster: Cluster, verb: str, name: str) -> None:
    """slurmd on the other compute nodes, with the node list the controller now has."""
    computes = [n.name for n in cluster.nodes if "compute" in n.roles and n.name != name]
    if not computes:
        return
    _step(
        site, console, f"{verb} {name}: slurmd on the other compute nodes", command=f"{verb} {name} (slurmd)",
        playbook="slurmd-config.yml", limit=",".join(computes), secrets=False,
    )  # fmt: skip


def node_entry(
    address: str | None,
    profile: str | None,
    *,
    rack: str | None = None,
    leaf: str | None = None,
    ssh_host: str | None = None,
    ssh_port: int | None = None,
) -> dict[str, Any] | None:
    """The cluster.yml entry for a compute node from add-node's options (None: already declared)."""
    if not (address or profile):
        return None
    if not (address and profile):
        raise CorectlError("add-node: --address and --profile go together", exit_code=2)
    entry: dict[str, Any] = {"address": address, "profile": profile, "roles": ["compute"]}
    entry.update({k: v for k, v in (("rack", rack), ("leaf", leaf)) if v})
    ssh = {k: v for k, v in (("host", ssh_host), ("port", ssh_port)) if v}
    if ssh:
        entry["ssh"] = ssh
    return entry


def add_node(
    ctx: Context,
    console: Console,
    name: str,
    *,
    entry: dict[str, Any] | None,
    partitions: list[str],
    login: Login | None = None,
    accept: Callable[[str, str], bool] | None = None,
) -> None:
    site, current = ctx.site, ctx.cluster
    declared = any(n.name == name for n in current.nodes)
    before = None if declared else site.cluster_file.read_bytes()
    if not declared:
        if entry is None:
            raise CorectlError(f"{name} is not in {site.cluster_file}; give --address and --profile", exit_code=2)
        if not partitions:
            partitions = [p.name for p in current.config.slurm.partitions if p.default]
        edit.add_node(site, {"name": name, **entry}, partitions)
        console.print(f"{site.cluster_file}: {name} added (partitions: {', '.join(partitions) or 'none'})")
    cluster = ctx.reload() if before is not None else ctx.rendered()
    secrets.check(site)
    if login is not None:  # a fresh machine: first contact before Ansible can reach it
        bootstrap(ctx, console, [name], login, accept or (lambda _node, _key: False))
    node = cluster.node(name)
    if "compute" not in node.roles:
        raise CorectlError(f"add-node handles compute nodes; {name} has roles {', '.join(node.roles)}", exit_code=2)
    _check_slurm_release(ctx, console, name, before)
    others = [n.name for n in cluster.nodes if n.name != name]
    _update_hosts(site, console, "add-node", name, others)
    _update_config(site, console, cluster, "add-node", name)
    _update_slurmd(site, console, cluster, "add-node", name)
    set_state(ctx, console, name, "drain", ADD_REASON)
    _step(site, console, f"add-node {name}: the node itself", command=f"add-node {name}", limit=name)
    report = health(ctx, console, limit=name)
    if not report.ok:
        failed = [c["name"] for c in report.nodes.get(name, {}).get("checks", []) if c.get("status") == "fail"]
        raise CorectlError(f"{name} failed its health checks ({', '.join(failed)}); it stays drained")
    set_state(ctx, console, name, "resume")
    console.print(f"{name} is in service")


def remove_node(ctx: Context, console: Console, name: str, *, timeout: int) -> None:
    site, cluster = ctx.site, ctx.cluster
    try:
        node = cluster.node(name)
    except KeyError:
        raise CorectlError(f"{name} is not a node of site {site.name}", exit_code=2) from None
    if "compute" not in node.roles:
        raise CorectlError(f"remove-node handles compute nodes; {name} has roles {', '.join(node.roles)}", exit_code=2)
    edit.remove_node(site, name, write=False)  # refuse before draining anything
    secrets.check(site)
    controller = cluster.with_role("slurm_controller")[0].name
    _step(
        site,
        console,
        f"remove-node {name}: drain and wait for its jobs",
        command=f"remove-node {name} (drain)",
        playbook="node-retire.yml",
        limit=controller,
        secrets=False,
        extravars={"corectl_retire_node": name, "corectl_retire_timeout": timeout},
    )
    cluster = edit.remove_node(site, name)
    console.print(f"{site.cluster_file}: {name} removed")
    ctx.reload()
    _update_config(site, console, cluster, "remove-node", name)
    _update_slurmd(site, console, cluster, "remove-node", name)
    others = hostlist.compress([n.name for n in cluster.nodes])
    _update_hosts(site, console, "remove-node", name, [n.name for n in cluster.nodes])
    console.print(f"{name} removed from Slurm, Prometheus and cluster.yml (remaining: {others})")

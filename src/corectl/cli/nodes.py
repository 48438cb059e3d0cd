"""Commands on compute nodes: drain, resume, add-node, remove-node, heal, validate-nodes, power."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from corectl.cli import options, policy
from corectl.cli.app import app, out
from corectl.cli.options import InventoryOpt, NodesArg, PasswordEnvOpt, WaitOpt, YesOpt, seconds
from corectl.errors import CorectlError


@app.command()
def drain(
    nodes: NodesArg,
    inventory: InventoryOpt = None,
    reason: Annotated[str, typer.Option("--reason", "-r", help="why (shown by sinfo -R)")] = "",
    wait: WaitOpt = 0,
) -> None:
    """Drain nodes in Slurm: running jobs finish, no new jobs start there."""
    from corectl.commands.nodes import drain as run_drain

    with policy.changing(policy.site(inventory), wait) as ctx:
        result = run_drain(ctx, out, nodes, reason)
    policy.require_ok(result, "drain")


@app.command()
def resume(nodes: NodesArg, inventory: InventoryOpt = None, wait: WaitOpt = 0) -> None:
    """Return drained nodes to service in Slurm."""
    from corectl.commands.nodes import resume as run_resume

    with policy.changing(policy.site(inventory), wait) as ctx:
        result = run_resume(ctx, out, nodes)
    policy.require_ok(result, "resume")


@app.command("add-node")
def add_node(
    node: Annotated[str, typer.Argument(help="the new compute node's name, e.g. dgx13")],
    inventory: InventoryOpt = None,
    address: Annotated[str | None, options.address("its address (when cluster.yml does not declare it yet)")] = None,
    profile: Annotated[str | None, typer.Option(help="its hardware profile (idem)")] = None,
    leaf: Annotated[str | None, typer.Option(help="its leaf switch (idem)")] = None,
    rack: Annotated[str | None, typer.Option(help="its rack (idem)")] = None,
    ssh_host: Annotated[str | None, typer.Option(help="SSH endpoint host, when not the address")] = None,
    ssh_port: Annotated[int | None, typer.Option(help="SSH port, when not 22")] = None,
    partition: Annotated[
        list[str] | None, typer.Option("--partition", "-p", help="partitions to join (default: the default one)")
    ] = None,
    bootstrap_user: Annotated[
        str | None, typer.Option(help="bootstrap the node first, logging in as this user (see corectl bootstrap)")
    ] = None,
    password_env: PasswordEnvOpt = None,
    yes: YesOpt = False,
    wait: WaitOpt = 0,
) -> None:
    """Add a compute node: declare it, update only the hosts that must change, provision and check it, resume it."""
    from corectl.commands.lifecycle import add_node as run_add
    from corectl.commands.lifecycle import node_entry

    entry = node_entry(address, profile, rack=rack, leaf=leaf, ssh_host=ssh_host, ssh_port=ssh_port)
    site = policy.existing_site(inventory)  # before the password prompt: no site, no prompt
    login = policy.bootstrap_login(bootstrap_user, password_env, None) if bootstrap_user else None
    with policy.changing(site, wait) as ctx:
        run_add(
            ctx, out, node, entry=entry, partitions=partition or [], login=login, accept=policy.host_key_prompt(yes)
        )


@app.command("remove-node")
def remove_node(
    node: Annotated[str, typer.Argument(help="the compute node to retire")],
    inventory: InventoryOpt = None,
    timeout: Annotated[int, seconds("seconds to wait for its jobs to end", minimum=0)] = 3600,
    wait: WaitOpt = 0,
) -> None:
    """Drain a node, wait for its jobs, and remove it from Slurm, monitoring and cluster.yml."""
    from corectl.commands.lifecycle import remove_node as run_remove

    with policy.changing(policy.site(inventory), wait) as ctx:
        run_remove(ctx, out, node, timeout=timeout)


@app.command("validate-nodes")
def validate_nodes(
    nodes: Annotated[
        str | None,
        typer.Argument(metavar="[NODES]", help="these GPU nodes now, if idle (default: the idle ones, as the timer)"),
    ] = None,
    inventory: InventoryOpt = None,
    pairwise: Annotated[
        bool, typer.Option("--pairwise", help="NCCL all_reduce and ib_write_bw between pairs of nodes: drain bad ones")
    ] = False,
    wait: WaitOpt = 0,
) -> None:
    """Run a validation round now: dcgmi diag and NCCL all_reduce as Slurm jobs of the validation QOS (any user
    job preempts them); a node that fails is drained with the figure in its reason. Exit 1 if one fails."""
    from corectl.commands.validate import FAILED
    from corectl.commands.validate import validate_nodes as run_validation

    with policy.changing(policy.site(inventory), wait) as ctx:
        results = run_validation(ctx, out, nodes, pairwise)
    if any(r.result in FAILED for r in results):
        raise typer.Exit(1)


@app.command()
def heal(
    nodes: Annotated[
        str | None, typer.Argument(metavar="[NODES]", help="only these compute nodes (default: every one)")
    ] = None,
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Remediate nodes the health checks drained: each failing check's ladder (group_vars), checks after
    every step, resume what passes; what cannot be healed stays drained for hardware service."""
    from corectl.commands.heal import heal as run_heal
    from corectl.commands.heal import outcome_table

    with policy.changing(policy.site(inventory), wait) as ctx:
        outcomes = run_heal(ctx, out, nodes, warn=policy.warn)
    out.print(outcome_table(outcomes))
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


@app.command()
def power(
    action: Annotated[str, typer.Argument(metavar="ACTION", help="status, on, off (hard), soft (ACPI) or cycle")],
    nodes: Annotated[str, typer.Argument(metavar="NODES", help="node(s) with a bmc in cluster.yml, e.g. dgx[01-04]")],
    inventory: InventoryOpt = None,
    force: Annotated[bool, options.force("off/soft/cycle even a node with running jobs or a non-compute node")] = False,
    timeout: Annotated[int, seconds("seconds to wait for the new power state", minimum=1)] = 120,
    wait: WaitOpt = 0,
) -> None:
    """Power through the nodes' BMCs (Redfish or IPMI); refuses to cut a node with running jobs."""
    from corectl.commands.power import power as run_power
    from corectl.commands.power import power_table

    guard = (
        contextlib.nullcontext(policy.reading(inventory))
        if action == "status"
        else policy.changing(policy.site(inventory), wait)
    )
    with guard as ctx:
        results = run_power(ctx, action, nodes, force=force, timeout=timeout, warn=policy.warn)
    out.print(power_table(action, results))
    failed = [r.node for r in results if not r.ok]
    if failed:
        raise CorectlError(f"power {action} failed on {', '.join(failed)}")

"""Commands that run playbooks on the site: provision, plan, bootstrap, upgrade drivers, os and slurm, runners
bootstrap, and the record of past runs (runs)."""

from __future__ import annotations

from typing import Annotated

import typer

from corectl.cli import options, policy
from corectl.cli.app import app, out, runners_app, upgrade_app
from corectl.cli.options import (
    BatchOpt,
    InventoryOpt,
    KeyOpt,
    LastOpt,
    LimitOpt,
    PasswordEnvOpt,
    TagsOpt,
    WaitOpt,
    YesOpt,
    seconds,
)


@app.command()
def provision(
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    tags: TagsOpt = None,
    check: Annotated[bool, options.check("a dry run (Ansible's check mode)")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="show the changes to files")] = False,
    wait: WaitOpt = 0,
    local: Annotated[
        bool, typer.Option("--local", help="run from this host even where cluster.yml names runner hosts")
    ] = False,
) -> None:
    """Validate, render and run the site playbook on the site's nodes (through its runners, if any)."""
    from corectl.commands.provision import provision as run_provision

    with policy.changing(policy.site(inventory), wait) as ctx:
        result = run_provision(ctx, out, limit=limit, tags=tags, check=check, diff=diff, local=local)
    policy.require_ok(result, "provision", per_host=True)


@app.command()
def plan(inventory: InventoryOpt = None, limit: LimitOpt = None, tags: TagsOpt = None) -> None:
    """Dry run of provision (check + diff) with a per-host list of what would change."""
    from corectl.commands.provision import plan as run_plan

    policy.require_ok(run_plan(policy.recording(inventory), out, limit=limit, tags=tags), "plan", per_host=True)


@app.command()
def bootstrap(
    inventory: InventoryOpt = None,
    nodes: Annotated[list[str] | None, typer.Argument(help="nodes (default: every node of the site)")] = None,
    user: Annotated[str, options.login_user("user for the first login (root, or an admin user with sudo)")] = "root",
    password_env: PasswordEnvOpt = None,
    key: KeyOpt = None,
    yes: YesOpt = False,
    wait: WaitOpt = 0,
) -> None:
    """First contact with fresh nodes: record host keys, install corectl's key, make sure python3 is there."""
    from corectl.commands.bootstrap import bootstrap as run_bootstrap

    site = policy.existing_site(inventory)  # before the password prompt: no site, no prompt
    login = policy.bootstrap_login(user, password_env, key)
    with policy.changing(site, wait) as ctx:
        run_bootstrap(ctx, out, nodes or [], login, policy.host_key_prompt(yes))


@upgrade_app.command("drivers")
def upgrade_drivers(
    inventory: InventoryOpt = None,
    batch: BatchOpt = 1,
    timeout: Annotated[int, seconds("seconds to wait for a node's running jobs to end", minimum=60)] = 3600,
    limit: LimitOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Rolling, drain-aware upgrade to group_vars' nvidia_driver_version: idle nodes first, no job killed."""
    from corectl.commands.upgrade import upgrade_drivers as run_upgrade

    with policy.changing(policy.site(inventory), wait) as ctx:
        results = run_upgrade(ctx, out, batch=batch, timeout=timeout, limit=limit)
    out.print(f"upgrade drivers: {len(results)} batch(es) done", highlight=False)


@upgrade_app.command("os")
def upgrade_os(
    inventory: InventoryOpt = None,
    batch: BatchOpt = 1,
    timeout: Annotated[int, seconds("seconds to wait for a node's jobs to end and its reboot", minimum=60)] = 3600,
    security_only: Annotated[
        bool, typer.Option("--security-only", help="only updates from a security archive")
    ] = False,
    limit: LimitOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Rolling package updates of the compute nodes, what corectl pins left out: a node that must reboot is
    drained, rebooted once its jobs have ended, and resumed after its validation; never into a kernel without
    the NVIDIA modules."""
    from corectl.commands.upgrade import upgrade_os as run_upgrade

    with policy.changing(policy.site(inventory), wait) as ctx:
        results = run_upgrade(ctx, out, batch=batch, timeout=timeout, security_only=security_only, limit=limit)
    out.print(f"upgrade os: {len(results)} batch(es) done", highlight=False)


@upgrade_app.command("slurm")
def upgrade_slurm(inventory: InventoryOpt = None, batch: BatchOpt = 1, wait: WaitOpt = 0) -> None:
    """Every Slurm host to the release the controller's repositories offer, in SchedMD's order: slurmdbd, then
    slurmctld, then slurmd (--batch nodes at a time, under running jobs); a backup first; a jump past SchedMD's
    rule is refused."""
    from corectl.commands.backup import backup as run_backup
    from corectl.commands.backup import table
    from corectl.commands.upgrade import upgrade_slurm as run_upgrade

    with policy.changing(policy.site(inventory), wait) as ctx:
        plan, result = run_upgrade(
            ctx, out, batch=batch, backup=lambda: out.print(table(run_backup(ctx, out, list_only=False)))
        )
    if result is None:
        out.print(f"upgrade slurm: every Slurm host has {plan.target}: nothing to upgrade", highlight=False)
    else:
        out.print(f"upgrade slurm: {plan.line()}: done", highlight=False)


@runners_app.command("bootstrap")
def runners_bootstrap(inventory: InventoryOpt = None, wait: WaitOpt = 0) -> None:
    """Install this host's ansible-core, ansible-runner and collections on every runner host."""
    from corectl.commands.runners import bootstrap_runners

    site = policy.site(inventory)
    with policy.changing(site, wait):  # not while a provision fans out over them
        bootstrap_runners(site, out)


@app.command()
def runs(
    inventory: InventoryOpt = None,
    last: LastOpt = 20,
    show: Annotated[
        str | None, typer.Option("--show", help="what one run changed, per host and task: a run id, a prefix, or last")
    ] = None,
) -> None:
    """List past runs (when, command, result, hosts changed/failed) from the kept artifacts."""
    from corectl.commands.runs import runs_table, show_run

    site = policy.site(inventory)
    out.print(show_run(site, show) if show else runs_table(site, last))

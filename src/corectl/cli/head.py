"""Commands on the head node: backup, restore."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from corectl.cli import options, policy
from corectl.cli.app import app, err, out
from corectl.cli.options import InventoryOpt, JsonOpt, WaitOpt


@app.command()
def backup(
    inventory: InventoryOpt = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="list the backups kept, with size, age and whether each verifies")
    ] = False,
    json_out: JsonOpt = False,
    wait: WaitOpt = 0,
) -> None:
    """Back up the head node now: the accounting database (one transaction), slurmctld's saved state and what
    corectl keeps (run records, failure history, encrypted secrets), checksummed, to cluster.yml's backup
    destination; the oldest beyond its retention are removed. --list: exit 1 when one does not verify."""
    from corectl.commands.backup import backup as run_backup
    from corectl.commands.backup import backups_json, table

    progress = err if json_out else out  # stdout holds only the JSON
    if list_only:
        backups = run_backup(policy.reading(inventory), progress, list_only=True)
    else:
        with policy.changing(policy.site(inventory), wait) as ctx:
            backups = run_backup(ctx, progress, list_only=False)
    if json_out:
        print(json.dumps(backups_json(backups), indent=2))
    else:
        out.print(table(backups))
    if any(k.verified != "ok" for k in backups.kept):
        raise typer.Exit(1)


@app.command()
def restore(
    inventory: InventoryOpt = None,
    backup: Annotated[
        str | None, typer.Option("--backup", help="the backup's name (corectl backup --list); default: the newest")
    ] = None,
    force: Annotated[
        bool, options.force("restore even over jobs the database holds that are newer than the backup")
    ] = False,
    wait: WaitOpt = 0,
) -> None:
    """Bring a replacement head (same name and address, provisioned) back to a backup: the accounting database,
    and slurmctld's saved state unless a newer one is there (state on shared storage), with slurmctld and slurmdbd
    stopped meanwhile. Refuses a backup that does not verify, and a database holding newer jobs unless --force."""
    from corectl.commands.restore import restore as run_restore

    with policy.changing(policy.site(inventory), wait) as ctx:
        done = run_restore(ctx, out, backup, force)
    out.print(f"restored backup {done.backup} (taken {done.created}) on {done.head}: the accounting database"
              + (f" and slurmctld's saved state ({done.state})" if done.state else ""), markup=False)  # fmt: skip
    if done.kept_aside:
        out.print(f"the state found there is kept in {done.kept_aside}", markup=False)
    if done.state_kept:
        out.print(f"slurmctld's saved state in {done.state_kept} is newer than the backup: kept as it was (its jobs "
                  "and the accounting records queued in it go on)", markup=False)  # fmt: skip
    if done.second:
        out.print(f"the second controller {done.second}: slurmctld stopped meanwhile, running again", markup=False)

"""Commands on the head node: backup."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from corectl.cli import policy
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

    site = policy.site(inventory)
    progress = err if json_out else out  # stdout holds only the JSON
    if list_only:
        backups = run_backup(site, progress, list_only=True)
    else:
        with policy.changing(site, wait):
            backups = run_backup(site, progress, list_only=False)
    if json_out:
        print(json.dumps(backups_json(backups), indent=2))
    else:
        out.print(table(backups))
    if any(k.verified != "ok" for k in backups.kept):
        raise typer.Exit(1)

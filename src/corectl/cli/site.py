"""Commands on a site's description and secrets: init, validate, render, schema, secrets *."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

from corectl.cli import options, policy
from corectl.cli.app import app, out, secrets_app
from corectl.cli.options import InventoryOpt, WaitOpt


@app.command()
def init(
    name: Annotated[str, typer.Argument(help="the new site's name (inventories/NAME)")],
) -> None:
    """Start a new site: a commented cluster.yml that validates, group_vars/, and its secrets."""
    from corectl.commands.init import check_name, init_site, next_steps

    check_name(name)
    site = policy.site(name)
    for item in init_site(site):
        out.print(f"wrote {item}", markup=False)
    password_env = bool(os.environ.get("CORECTL_VAULT_PASSWORD_FILE") or os.environ.get("CORECTL_VAULT_PASSWORD"))
    for line in next_steps(site, password_env):
        out.print(line, markup=False)


@app.command()
def validate(inventory: InventoryOpt = None) -> None:
    """Check cluster.yml; print one line per problem (file:line: field: what is wrong)."""
    from corectl.commands.inventory import validate_site

    out.print(validate_site(policy.site(inventory)))


@app.command()
def render(
    inventory: InventoryOpt = None,
    check: Annotated[bool, options.check("exit 1 if a rendered file is stale")] = False,
    wait: WaitOpt = 0,
) -> None:
    """Write inventories/<site>/hosts.yml, nodes.json, switches.json and site.json from cluster.yml (deterministic)."""
    from corectl.commands.inventory import render as run_render

    site = policy.site(inventory)
    with contextlib.nullcontext() if check else policy.changing(site, wait):
        line = run_render(site, check)
    out.print(line)


@app.command()
def schema() -> None:
    """Print the JSON Schema of cluster.yml (for editors)."""
    from corectl.commands.inventory import schema as make_schema

    out.print(make_schema(), markup=False, soft_wrap=True)


@secrets_app.command("init")
def secrets_init(inventory: InventoryOpt = None, wait: WaitOpt = 0) -> None:
    """Generate every missing secret of the site (existing ones are kept), vault-encrypted."""
    from corectl.commands import secrets

    site = policy.site(inventory)
    with policy.changing(site, wait):
        lines = secrets.init(site)
    for line in lines:
        out.print(line)


@secrets_app.command("check")
def secrets_check(inventory: InventoryOpt = None) -> None:
    """Check that every secret exists, decrypts and is no placeholder (values are never shown)."""
    from corectl.commands import secrets

    out.print(secrets.check(policy.site(inventory)))


@secrets_app.command("set-ceph-key")
def secrets_set_ceph_key(
    client: Annotated[str, typer.Argument(help="cephx client id, without 'client.'")],
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Store a CephFS client key read from standard input (ceph auth get-key client.ID | ...)."""
    from corectl.commands import secrets

    site = policy.site(inventory)
    key = sys.stdin.read()
    with policy.changing(site, wait):
        line = secrets.set_ceph_key(site, client, key)
    out.print(line)


@secrets_app.command("set-webhook")
def secrets_set_webhook(
    receiver: Annotated[str, typer.Argument(help="an alert receiver of cluster.yml with webhook: true")],
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Store an alert receiver's webhook URL read from standard input (it usually holds a token)."""
    from corectl.commands import secrets

    site = policy.site(inventory)
    url = sys.stdin.readline() if not sys.stdin.isatty() else typer.prompt("webhook URL", hide_input=True)
    with policy.changing(site, wait):
        line = secrets.set_webhook(site, receiver, url)
    out.print(line)


@secrets_app.command("set-bmc")
def secrets_set_bmc(
    user: Annotated[str, options.login_user("the BMC user corectl logs in as")],
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Store the nodes' BMC user and password (read from standard input), vault-encrypted."""
    from corectl.commands import secrets

    site = policy.site(inventory)
    password = (
        sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else typer.prompt("BMC password", hide_input=True)
    )
    with policy.changing(site, wait):
        line = secrets.set_bmc(site, user, password)
    out.print(line)


@secrets_app.command("backup-key")
def secrets_backup_key(inventory: InventoryOpt = None) -> None:
    """Print the public key the head logs in to the backup host with (cluster.yml backup.ssh): put it in that
    user's authorized_keys there."""
    from corectl.commands import secrets

    out.print(secrets.backup_key(policy.site(inventory)), markup=False, soft_wrap=True)

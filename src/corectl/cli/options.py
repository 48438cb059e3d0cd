"""Every option more than one command takes, defined once (typer's Annotated form)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

InventoryOpt = Annotated[
    str | None,
    typer.Option(
        "--inventory",
        "-i",
        metavar="SITE",
        help="site name under inventories/, or a path to a site directory "
        "(default: $CORECTL_INVENTORY, else the only site besides the lab)",
        show_default=False,
    ),
]
LabInventoryOpt = Annotated[str, typer.Option("--inventory", "-i", help="lab site name or directory")]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        metavar="SECONDS",
        help="while another changing command holds the site, wait up to this many seconds",
    ),
]
LimitOpt = Annotated[
    str | None,
    typer.Option(
        "--limit", "-l", metavar="HOSTS", help="only these hosts or groups (Ansible pattern, e.g. dgx[01-04])"
    ),
]
TagsOpt = Annotated[str | None, typer.Option("--tags", "-t", metavar="TAGS", help="only tasks with these tags")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="accept new host keys without asking")]
PasswordEnvOpt = Annotated[
    str | None, typer.Option(help="read the login (and sudo) password from this environment variable")
]
NodesArg = Annotated[str, typer.Argument(help="compute node(s), e.g. dgx03 or dgx[01-04]")]


def seconds(help: str, *, minimum: int) -> Any:
    """``--timeout SECONDS``: how long a command waits for something; what for is the command's."""
    return typer.Option("--timeout", min=minimum, metavar="SECONDS", help=help)


KeyOpt = Annotated[Path | None, typer.Option(help="log in with this existing private key instead")]

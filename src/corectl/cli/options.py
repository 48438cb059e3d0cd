"""Every option more than one command takes, defined once (typer's Annotated form)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def inventory(default: str) -> Any:
    """``--inventory SITE``, for commands whose default site is ``default`` (said in the help)."""
    return typer.Option(
        "--inventory",
        "-i",
        metavar="SITE",
        help=f"site name under inventories/, or a path to a site directory (default: {default})",
        show_default=False,
    )


InventoryOpt = Annotated[str | None, inventory("$CORECTL_INVENTORY, else the only site besides the lab")]
LabInventoryOpt = Annotated[str, inventory("lab")]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        metavar="SECONDS",
        help="while another changing command holds the site, wait up to this many seconds",
    ),
]


def release(help: str) -> Any:
    """``--release SUITE``: a stand-in's Debian release (corectl.lab.image.RELEASES)."""
    return typer.Option("--release", metavar="SUITE", help=f"{help}: bookworm (Debian 12) or trixie (Debian 13)")


ReleaseOpt = Annotated[str, release("the stand-ins' Debian release")]
NodeReleaseOpt = Annotated[str | None, release("its Debian release, when not the lab's")]
# an upgrade's batch: checked by the command (a batch below 1 is refused with one line, exit 2)
BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="nodes out of service at a time")]
LimitOpt = Annotated[
    str | None,
    typer.Option(
        "--limit", "-l", metavar="HOSTS", help="only these hosts or groups (Ansible pattern, e.g. dgx[01-04])"
    ),
]
TagsOpt = Annotated[str | None, typer.Option("--tags", "-t", metavar="TAGS", help="only tasks with these tags")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]
LastOpt = Annotated[int, typer.Option("--last", min=1, help="how many to show, newest first")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="accept new host keys without asking")]
PasswordEnvOpt = Annotated[
    str | None, typer.Option(help="read the login (and sudo) password from this environment variable")
]
NodesArg = Annotated[str, typer.Argument(help="compute node(s), e.g. dgx03 or dgx[01-04]")]


def seconds(help: str, *, minimum: int) -> Any:
    """``--timeout SECONDS``: how long a command waits for something; what for is the command's."""
    return typer.Option("--timeout", min=minimum, metavar="SECONDS", help=help)


KeyOpt = Annotated[Path | None, typer.Option(help="log in with this existing private key instead")]


def check(help: str) -> Any:
    """``--check``: change nothing, only say what would change; what is said is the command's."""
    return typer.Option("--check", help=f"change nothing: {help}")


def login_user(help: str) -> Any:
    """``--user NAME``: the user corectl logs in as; where to is the command's."""
    return typer.Option("--user", metavar="NAME", help=help)


def address(help: str) -> Any:
    """``--address IP``: the address of what the command adds or serves."""
    return typer.Option("--address", metavar="IP", help=help)


def days(help: str) -> Any:
    """``--days N``: a period of N days up to now; what it bounds is the command's."""
    return typer.Option("--days", min=1, metavar="N", help=help)


def force(help: str) -> Any:
    """``--force``: go ahead past a refusal that protects something; what it overrides is the command's."""
    return typer.Option("--force", help=help)

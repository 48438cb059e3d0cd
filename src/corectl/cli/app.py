"""The typer application: the root command group with its error policy, the sub-groups, and the
two consoles every command prints to."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from corectl.errors import CorectlError, ValidationFailed

err = Console(stderr=True, highlight=False, emoji=False)
# Piped output (CI logs, grep) gets whole lines instead of rich's 80-column default.
out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


class _Group(TyperGroup):
    """User mistakes end as one-line errors with a non-zero exit, never as tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ValidationFailed as exc:
            err.print(str(exc), markup=False, soft_wrap=True)
            raise SystemExit(exc.exit_code) from None
        except CorectlError as exc:
            err.print(f"error: {exc}", markup=False, soft_wrap=True)
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise SystemExit(130) from None


app = typer.Typer(
    cls=_Group,
    help="Bring DGX nodes from bare OS to a working Slurm GPU cluster, and keep them healthy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    verbose: int = typer.Option(
        0,
        "--verbose",
        "-v",
        count=True,
        show_default=False,
        metavar="",
        help="show what Ansible does, as ansible-playbook -v, -vv ... would (corectl -v provision)",
    ),
) -> None:
    # Ansible's own setting (ANSIBLE_VERBOSITY): every run the command starts inherits it, here or on runner hosts
    # and nodes, and its live progress prints what Ansible says (corectl.progress)
    if verbose:
        os.environ["ANSIBLE_VERBOSITY"] = str(min(verbose, 6))


lab_app = typer.Typer(help="The local stand-in cluster (systemd containers).", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
runners_app = typer.Typer(help="Runner hosts that runs fan out over (cluster.yml control).", no_args_is_help=True)
app.add_typer(runners_app, name="runners")
upgrade_app = typer.Typer(help="Rolling, drain-aware upgrades.", no_args_is_help=True)
app.add_typer(upgrade_app, name="upgrade")
secrets_app = typer.Typer(help="Site secrets (munge key, database passwords), vault-encrypted.", no_args_is_help=True)
app.add_typer(secrets_app, name="secrets")

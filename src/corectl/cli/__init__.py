"""The corectl command line (typer): `app` with one module per command group, each registering
its commands on import; options shared by commands are defined once in `cli.options`, and the
site, lock and exit policy in `cli.policy`. Commands parse options and call into
corectl.commands, nothing deeper."""

from __future__ import annotations

from importlib import import_module

from corectl.cli.app import app

# each group registers its commands on import, in the order `corectl --help` lists them
GROUPS = ("site", "runs", "nodes", "head", "observe", "lab")
for _group in GROUPS:
    import_module(f"corectl.cli.{_group}")

__all__ = ["app", "main"]


def main() -> None:
    app()

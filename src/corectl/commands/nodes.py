"""drain, resume: Slurm node state, set on the controller through the site's inventory."""

from __future__ import annotations

from rich.console import Console

from corectl.ansible import RunResult
from corectl.site.context import Context
from corectl.slurm import set_state


def drain(ctx: Context, console: Console, nodes: str, reason: str) -> RunResult:
    return set_state(ctx, console, nodes, "drain", reason)


def resume(ctx: Context, console: Console, nodes: str) -> RunResult:
    return set_state(ctx, console, nodes, "resume")

"""drain, resume: Slurm node state, set on the controller through the site's inventory."""

from __future__ import annotations

from rich.console import Console

from corectl.ansible import RunResult
from corectl.site import Site
from corectl.slurm import set_state


def drain(site: Site, console: Console, nodes: str, reason: str) -> RunResult:
    return set_state(site, console, nodes, "drain", reason)


def resume(site: Site, console: Console, nodes: str) -> RunResult:
    return set_state(site, console, nodes, "resume")

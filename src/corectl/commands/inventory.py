"""validate, render, schema: what reads cluster.yml without touching a node."""

from __future__ import annotations

from corectl.site import Site
from corectl.site.inventory import render_site, schema, validate

__all__ = ["render", "schema", "validate_site"]


def validate_site(site: Site) -> str:
    """The line `corectl validate` prints for a valid cluster.yml (an invalid one raises)."""
    cluster = validate(site)
    return f"{cluster.config.cluster.name}: cluster.yml is valid ({len(cluster.nodes)} nodes)"


def render(site: Site, check: bool) -> str:
    """Write the rendered files (``check``: only say whether they are current); the line to print."""
    cluster, changed = render_site(site, check_only=check)
    state = "up to date" if check or not changed else "written"
    return f"{site.hosts_file}: {state} ({len(cluster.nodes)} hosts)"

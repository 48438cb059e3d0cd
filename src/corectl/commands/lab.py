"""lab up: stand-in nodes, their inventory and secrets, and optionally the stand-in Ceph."""

from __future__ import annotations

from corectl import secrets
from corectl.commands.inventory import render_site
from corectl.lab import ceph
from corectl.lab.nodes import LabNode, LabSpec, up


def lab_up(spec: LabSpec) -> tuple[list[LabNode], str | None]:
    """Return the nodes and the Ceph monitor address (None without Ceph)."""
    nodes = up(spec)
    render_site(spec.site, check_only=False)
    secrets.init(spec.site)
    return nodes, ceph.ensure(spec) if spec.ceph else None

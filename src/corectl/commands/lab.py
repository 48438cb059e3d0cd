"""lab up, down, add, replace, image, repo: the stand-in cluster on this machine (corectl.lab)."""

from __future__ import annotations

from corectl import secrets
from corectl.lab import ceph, repo
from corectl.lab.image import ensure_baked_image, ensure_ceph_image, ensure_image
from corectl.lab.nodes import add, down, replace_node, up
from corectl.lab.spec import LabNode, LabSpec
from corectl.site.context import Context

__all__ = [
    "LabSpec", "add", "down", "ensure_baked_image", "ensure_ceph_image", "ensure_image", "lab_up", "replace_node",
    "repo_serve", "repo_stop", "up_lines",
]  # fmt: skip


def lab_up(spec: LabSpec) -> tuple[list[LabNode], str | None]:
    """Return the nodes and the Ceph monitor address (None without Ceph)."""
    nodes = up(spec)
    Context(spec.site).rendered()
    secrets.init(spec.site)
    return nodes, ceph.ensure(spec) if spec.ceph else None


def up_lines(spec: LabSpec, started: list[LabNode], ceph_address: str | None, inventory: str) -> list[str]:
    """What `corectl lab up` prints: each node's address and SSH port, the Ceph, the next step."""
    lines = [
        f"{node.name:8} {node.address:15} ssh 127.0.0.1:{node.ssh_port}" for node in [*started, *spec.runner_hosts()]
    ]
    if ceph_address:
        lines.append(f"{'ceph':8} {ceph_address:15} stand-in Ceph (mon, mgr, OSD, MDS): CephFS mounted at /shared")
    lines.append(f"lab '{spec.site.name}' is up; next: corectl provision --inventory {inventory}")
    return lines


def repo_serve(name: str, network: str, address: str) -> str:
    return repo.serve(name, network, address, label=name)


def repo_stop(name: str) -> None:
    repo.stop(name)

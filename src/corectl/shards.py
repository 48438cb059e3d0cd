"""Which runner host runs which nodes of a fanned-out run (cluster.yml `control:`, docs/scale.md).

A run becomes shards in two phases, so that the order the site playbook keeps across hosts
(slurmdbd before slurmctld before slurmd) holds across shards too:

1. ``services``: every targeted node with a service role (controller, dbd, login, monitoring),
   one shard on the first runner;
2. the compute-only nodes, one shard per leaf switch or rack (``shard_by``); nodes without one
   share the shard ``<shard_by>-none``. Shards go round-robin over the runners in name order;
   one runner runs its shards one after another, different runners side by side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corectl.model import Cluster, Control, RunnerHost

SERVICE_ROLES = frozenset({"slurm_controller", "slurm_dbd", "login", "monitoring"})


@dataclass(frozen=True)
class Shard:
    name: str
    phase: int  # 1: service nodes, 2: compute nodes
    runner: RunnerHost
    hosts: tuple[str, ...]


def plan(cluster: Cluster, targets: Iterable[str], control: Control) -> list[Shard]:
    """The shards of a run over ``targets`` (node names), phase by phase, each host in exactly one."""
    wanted = set(targets)
    nodes = [n for n in cluster.nodes if n.name in wanted]
    services = tuple(n.name for n in nodes if SERVICE_ROLES.intersection(n.roles))
    groups: dict[str, list[str]] = {}
    for node in nodes:
        if not SERVICE_ROLES.intersection(node.roles):
            key = node.leaf if control.shard_by == "leaf" else node.rack
            groups.setdefault(f"{control.shard_by}-{key or 'none'}", []).append(node.name)
    runners = control.runners
    shards = [Shard("services", 1, runners[0], services)] if services else []
    for index, name in enumerate(sorted(groups)):
        shards.append(Shard(name, 2, runners[index % len(runners)], tuple(groups[name])))
    return shards

"""Which runner host runs which nodes of a fanned-out run (cluster.yml `control:`, docs/scale.md).

A run becomes shards in two phases, so that the order the site playbook keeps across hosts
(slurmdbd before slurmctld before slurmd) holds across shards too:

1. ``services``: every targeted node with a service role (controller, dbd, login, monitoring),
   one shard on the first runner;
2. the compute-only nodes, grouped by leaf switch or rack (``shard_by``; nodes without one share
   the group ``<shard_by>-none``). A group stays whole on one runner (a group larger than
   ``shard_hosts`` is cut into parts of at most that many); groups go to the runner with the
   fewest hosts so far, in name order. Each runner then runs its groups as few jobs as it can:
   consecutive groups share a job up to ``shard_hosts`` hosts. A job's cost is mostly fixed
   (one ansible-playbook, ~180 task rounds however many hosts a round has), so a thousand
   four-node racks must not become a thousand jobs. Different runners run side by side; one
   runner's jobs run one after another.

A shard of one group is named after it (``rack-r07``); a shard of several after its runner and
its place on it (``runner2-1``), with the groups it holds listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corectl.site.model import Cluster, Control, Node
from corectl.site.model_services import RunnerHost

SERVICE_ROLES = frozenset({"slurm_controller", "slurm_dbd", "login", "monitoring"})


@dataclass(frozen=True)
class Shard:
    name: str
    phase: int  # 1: service nodes, 2: compute nodes
    runner: RunnerHost
    hosts: tuple[str, ...]
    groups: tuple[str, ...] = ()  # the leaves or racks (or parts of one) it holds; () for services


def _groups(nodes: list[Node], control: Control) -> list[tuple[str, list[str]]]:
    """(group name, its nodes) in name order; a group over ``shard_hosts`` cut into numbered parts."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        key = node.leaf if control.shard_by == "leaf" else node.rack
        groups.setdefault(f"{control.shard_by}-{key or 'none'}", []).append(node.name)
    size, out = control.shard_hosts, []
    for name in sorted(groups):
        members = groups[name]
        if len(members) <= size:
            out.append((name, members))
        else:
            parts = [members[i : i + size] for i in range(0, len(members), size)]
            out += [(f"{name}.{n}", part) for n, part in enumerate(parts, start=1)]
    return out


def plan(cluster: Cluster, targets: Iterable[str], control: Control) -> list[Shard]:
    """The shards of a run over ``targets`` (node names), phase by phase, each host in exactly one."""
    wanted = set(targets)
    nodes = [n for n in cluster.nodes if n.name in wanted]
    services = tuple(n.name for n in nodes if SERVICE_ROLES.intersection(n.roles))
    runners = control.runners
    shards = [Shard("services", 1, runners[0], services)] if services else []
    computes = [n for n in nodes if not SERVICE_ROLES.intersection(n.roles)]
    load = [0] * len(runners)
    dealt: list[list[tuple[str, list[str]]]] = [[] for _ in runners]
    for name, members in _groups(computes, control):
        least = load.index(min(load))
        load[least] += len(members)
        dealt[least].append((name, members))
    for runner, groups in zip(runners, dealt, strict=True):
        jobs: list[list[tuple[str, list[str]]]] = []
        for group in groups:
            if jobs and sum(len(m) for _, m in jobs[-1]) + len(group[1]) <= control.shard_hosts:
                jobs[-1].append(group)
            else:
                jobs.append([group])
        for index, job in enumerate(jobs, start=1):
            name = job[0][0] if len(job) == 1 else f"{runner.name}-{index}"
            hosts = tuple(host for _, members in job for host in members)
            shards.append(Shard(name, 2, runner, hosts, tuple(group for group, _ in job)))
    return shards

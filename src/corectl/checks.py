"""Rules that span sections of cluster.yml: expansion, references, uniqueness, topology.

Each rule reports the path of the exact field at fault, so the error line points at it.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterable
from dataclasses import dataclass

from corectl import hostlist
from corectl.model import ClusterConfig, Node, Switch
from corectl.yamlsrc import PathKey, dotted


@dataclass(frozen=True)
class Problem:
    path: PathKey
    message: str


def _choices(names: Iterable[str]) -> str:
    listed = sorted(set(names))
    return ", ".join(listed) if listed else "none declared"


def expand_nodes(config: ClusterConfig, problems: list[Problem]) -> list[Node]:
    """Expand node ranges into concrete nodes (reporting malformed ranges)."""
    ssh = config.cluster.ssh
    nodes: list[Node] = []
    for index, entry in enumerate(config.nodes):
        try:
            names = hostlist.expand(entry.name)
        except hostlist.HostlistError as exc:
            problems.append(Problem(("nodes", index, "name"), str(exc)))
            continue
        try:
            addresses = hostlist.expand_addresses(entry.address, len(names))
        except hostlist.HostlistError as exc:
            problems.append(Problem(("nodes", index, "address"), str(exc)))
            continue
        override = entry.ssh
        if override is not None and override.host is not None and len(names) > 1:
            problems.append(
                Problem(
                    ("nodes", index, "ssh", "host"), "a node range cannot share one ssh host; list the nodes singly"
                )
            )
            continue
        for name, address in zip(names, addresses, strict=True):
            nodes.append(
                Node(
                    name=name,
                    address=address,
                    profile=entry.profile,
                    roles=tuple(entry.roles),
                    rack=entry.rack,
                    leaf=entry.leaf,
                    ssh_host=(override.host if override and override.host else address),
                    ssh_port=(override.port if override and override.port else ssh.port),
                    ssh_user=(override.user if override and override.user else ssh.user),
                    jump_host=(override.jump_host if override and override.jump_host else ssh.jump_host),
                    source=index,
                )
            )
    return nodes


def _unknown(path: PathKey, kind: str, name: str, declared: Iterable[str]) -> Problem:
    return Problem(path, f"unknown {kind} '{name}' (declared: {_choices(declared)})")


def _duplicates(items: Iterable[tuple[str | int, PathKey]], what: str) -> list[Problem]:
    """One problem per (place, first place) pair, so a clashing range reports once."""
    seen: dict[str | int, PathKey] = {}
    clashes: dict[tuple[PathKey, PathKey], list[str | int]] = {}
    for value, path in items:
        if value in seen:
            clashes.setdefault((path, seen[value]), []).append(value)
        else:
            seen[value] = path
    problems = []
    for (path, first), values in clashes.items():
        more = f" and {len(values) - 1} more" if len(values) > 1 else ""
        problems.append(Problem(path, f"duplicate {what} '{values[0]}'{more} (already used at {dotted(first)})"))
    return problems


def check(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    problems += _check_cluster(config)
    problems += _check_nodes(config, nodes)
    problems += _check_fabric(config, nodes)
    problems += _check_identities(config)
    problems += _check_slurm(config, nodes)
    problems += _check_storage(config)
    return problems


def _check_cluster(config: ClusterConfig) -> list[Problem]:
    try:
        zoneinfo.ZoneInfo(config.cluster.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return [Problem(("cluster", "timezone"), f"unknown time zone '{config.cluster.timezone}'")]
    return []


def _check_nodes(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    for index, entry in enumerate(config.nodes):
        if entry.profile not in config.profiles:
            problems.append(_unknown(("nodes", index, "profile"), "profile", entry.profile, config.profiles))
        if len(set(entry.roles)) != len(entry.roles):
            problems.append(Problem(("nodes", index, "roles"), "a role is listed twice"))
    problems += _duplicates(((n.name, ("nodes", n.source, "name")) for n in nodes), "node name")
    problems += _duplicates(((n.address, ("nodes", n.source, "address")) for n in nodes), "node address")
    if not problems:
        problems += _duplicates(
            (
                (f"{n.ssh_host}:{n.ssh_port}", ("nodes", n.source, "ssh" if config.nodes[n.source].ssh else "address"))
                for n in nodes
            ),
            "ssh endpoint",
        )
    controllers = [n for n in nodes if "slurm_controller" in n.roles]
    if not controllers:
        problems.append(Problem(("nodes",), "no node has role slurm_controller (exactly one is required)"))
    for extra in controllers[1:]:
        problems.append(
            Problem(
                ("nodes", extra.source, "roles"),
                f"second slurm_controller '{extra.name}' (exactly one is allowed; first is '{controllers[0].name}')",
            )
        )
    if not any("compute" in n.roles for n in nodes):
        problems.append(Problem(("nodes",), "no node has role compute"))
    dbds = [n for n in nodes if "slurm_dbd" in n.roles]
    if config.slurm.accounting and not dbds:
        problems.append(Problem(("slurm", "accounting"), "accounting is on but no node has role slurm_dbd"))
    for extra in dbds[1:]:
        problems.append(Problem(("nodes", extra.source, "roles"), f"second slurm_dbd '{extra.name}' (at most one)"))
    if config.monitoring.prometheus and not any("monitoring" in n.roles for n in nodes):
        problems.append(Problem(("monitoring", "prometheus"), "prometheus is on but no node has role monitoring"))
    return problems


def _check_fabric(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    fabric = config.fabric
    if fabric is None:
        for index, entry in enumerate(config.nodes):
            if entry.leaf is not None:
                problems.append(Problem(("nodes", index, "leaf"), "a leaf switch is set but no fabric is declared"))
        return problems
    switches = {s.name: s for s in fabric.switches}
    problems += _duplicates(
        ((s.name, ("fabric", "switches", i, "name")) for i, s in enumerate(fabric.switches)), "switch name"
    )
    for i, switch in enumerate(fabric.switches):
        for j, child in enumerate(switch.switches):
            if child not in switches:
                problems.append(_unknown(("fabric", "switches", i, "switches", j), "switch", child, switches))
            elif child == switch.name:
                problems.append(Problem(("fabric", "switches", i, "switches", j), "a switch cannot contain itself"))
    parents: dict[str, list[str]] = {}
    for switch in fabric.switches:
        for child in switch.switches:
            parents.setdefault(child, []).append(switch.name)
    for i, switch in enumerate(fabric.switches):
        if _reaches(switch.name, switch.name, switches, set()):
            problems.append(Problem(("fabric", "switches", i, "switches"), "switches form a loop"))
    for index, entry in enumerate(config.nodes):
        if entry.leaf is None:
            if "compute" in entry.roles:
                problems.append(
                    Problem(("nodes", index, "leaf"), f"compute node '{entry.name}' hangs off no leaf switch")
                )
            continue
        target = switches.get(entry.leaf)
        if target is None:
            problems.append(_unknown(("nodes", index, "leaf"), "switch", entry.leaf, switches))
        elif target.switches:
            problems.append(
                Problem(("nodes", index, "leaf"), f"'{entry.leaf}' has switches below it, so it is not a leaf")
            )
    used_leaves = {n.leaf for n in nodes if n.leaf}
    for i, switch in enumerate(fabric.switches):
        if not switch.switches and switch.name not in used_leaves:
            problems.append(Problem(("fabric", "switches", i, "name"), f"leaf switch '{switch.name}' has no nodes"))
    return problems


def _reaches(start: str, goal: str, switches: dict[str, Switch], seen: set[str]) -> bool:
    for child in getattr(switches.get(start), "switches", []):
        if child == goal:
            return True
        if child not in seen:
            seen.add(child)
            if _reaches(child, goal, switches, seen):
                return True
    return False


def _check_identities(config: ClusterConfig) -> list[Problem]:
    problems: list[Problem] = []
    groups = {g.name for g in config.groups}
    problems += _duplicates(((g.name, ("groups", i, "name")) for i, g in enumerate(config.groups)), "group name")
    problems += _duplicates(((g.gid, ("groups", i, "gid")) for i, g in enumerate(config.groups)), "gid")
    problems += _duplicates(((u.name, ("users", i, "name")) for i, u in enumerate(config.users)), "user name")
    problems += _duplicates(((u.uid, ("users", i, "uid")) for i, u in enumerate(config.users)), "uid")
    for i, user in enumerate(config.users):
        if user.group not in groups:
            problems.append(_unknown(("users", i, "group"), "group", user.group, groups))
        for j, extra in enumerate(user.groups):
            if extra not in groups:
                problems.append(_unknown(("users", i, "groups", j), "group", extra, groups))
    return problems


def _check_slurm(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    by_name = {n.name: n for n in nodes}
    groups = {g.name for g in config.groups}
    partitions = config.slurm.partitions
    problems += _duplicates(
        ((p.name, ("slurm", "partitions", i, "name")) for i, p in enumerate(partitions)), "partition name"
    )
    defaults = [i for i, p in enumerate(partitions) if p.default]
    for i in defaults[1:]:
        problems.append(Problem(("slurm", "partitions", i, "default"), "more than one default partition"))
    for i, partition in enumerate(partitions):
        path = ("slurm", "partitions", i, "nodes")
        try:
            members = hostlist.expand(partition.nodes)
        except hostlist.HostlistError as exc:
            problems.append(Problem(path, str(exc)))
            continue
        for member in members:
            node = by_name.get(member)
            if node is None:
                problems.append(Problem(path, f"unknown node '{member}'"))
            elif "compute" not in node.roles:
                problems.append(Problem(path, f"node '{member}' is not a compute node"))
        for j, group in enumerate(partition.allow_groups):
            if group not in groups:
                problems.append(_unknown(("slurm", "partitions", i, "allow_groups", j), "group", group, groups))
    return problems


def _check_storage(config: ClusterConfig) -> list[Problem]:
    if config.cephfs is None:
        return []
    mounts = config.cephfs.mounts
    return _duplicates(
        ((m.mountpoint, ("cephfs", "mounts", i, "mountpoint")) for i, m in enumerate(mounts)), "mountpoint"
    )

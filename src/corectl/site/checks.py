"""Rules that span sections of cluster.yml: expansion, references, uniqueness, topology.

Each rule reports the path of the exact field at fault, so the error line points at it.
"""

from __future__ import annotations

import re
import zoneinfo
from pathlib import PurePosixPath

from corectl import hostlist
from corectl.site.checks_slurm import check_accounting, check_slurm
from corectl.site.model import BMC_DEFAULT_PORTS, Bmc, ClusterConfig, Node, NodeBmc, Switch
from corectl.site.model_services import POSITIVE_THRESHOLDS
from corectl.site.problems import Problem, duplicates, unknown
from corectl.site.yamlsrc import PathKey

_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def expand_nodes(config: ClusterConfig, problems: list[Problem]) -> list[Node]:
    """Expand node ranges into concrete nodes (reporting malformed ranges, at most MAX_NODES in all).

    All names first: a cluster past MAX_NODES is refused before a single Node is built.
    """
    ssh = config.cluster.ssh
    expanded: list[tuple[int, list[str]]] = []
    count = 0
    for index, entry in enumerate(config.nodes):
        try:
            names = hostlist.expand(entry.name, limit=hostlist.MAX_NODES - count)
        except hostlist.TooManyNames:
            message = f"'{entry.name[:60]}' takes the cluster past the limit of {hostlist.MAX_NODES:,} nodes"
            problems.append(Problem(("nodes", index, "name"), message))
            return []
        except hostlist.HostlistError as exc:
            problems.append(Problem(("nodes", index, "name"), str(exc)))
            continue
        count += len(names)
        bad = next((name for name in names if not _NODE_NAME.match(name)), None)
        if bad is not None:
            problems.append(
                Problem(
                    ("nodes", index, "name"),
                    f"'{bad[:70]}' is not a host name (a-z, 0-9 and '-', not first or last; at most 63 characters)",
                )
            )
            continue
        expanded.append((index, names))
    nodes: list[Node] = []
    for index, names in expanded:
        entry = config.nodes[index]
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
        bmcs: list[NodeBmc | None] = [None] * len(names)
        if entry.bmc is not None:
            try:
                bmcs = [_bmc(entry.bmc, a) for a in hostlist.expand_addresses(entry.bmc.address, len(names))]
            except hostlist.HostlistError as exc:
                problems.append(Problem(("nodes", index, "bmc", "address"), str(exc)))
                continue
        for name, address, bmc in zip(names, addresses, bmcs, strict=True):
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
                    bmc=bmc,
                )
            )
    return nodes


def _bmc(bmc: Bmc, address: str) -> NodeBmc:
    port = bmc.port or BMC_DEFAULT_PORTS[(bmc.protocol, bmc.scheme)]
    return NodeBmc(address=address, protocol=bmc.protocol, port=port, scheme=bmc.scheme, ca_file=bmc.ca_file)


def check(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    problems += _check_cluster(config)
    problems += _check_profiles(config)
    problems += _check_nodes(config, nodes)
    problems += _check_fabric(config, nodes)
    problems += _check_identities(config)
    problems += check_slurm(config, nodes)
    problems += check_accounting(config, nodes)
    problems += _check_storage(config)
    problems += _check_control(config)
    problems += _check_node_local(config)
    problems += _check_health(config)
    problems += _check_backup(config, nodes)
    problems += _check_alerts(config)
    if config.monitoring.grafana is not None and not config.monitoring.prometheus:
        problems.append(Problem(("monitoring", "grafana"), "needs monitoring.prometheus (Grafana's data source)"))
    problems += _check_failover(config, nodes)
    problems += _check_logs(config, {n.name for n in nodes})
    return problems


def _check_health(config: ClusterConfig) -> list[Problem]:
    problems = [
        Problem(("health", "thresholds", name), f"must be at least 1 (0 would turn the {name} limit off)")
        for name, value in config.health.thresholds.items()
        if name in POSITIVE_THRESHOLDS and value < 1
    ]
    validation = config.health.validation
    if validation is not None:
        if not config.slurm.accounting:
            problems.append(Problem(("health", "validation"), "needs slurm.accounting (its jobs run in a QOS)"))
        if validation.qos == "normal" or any(q.name == validation.qos for q in config.slurm.qos):
            why = (
                f"QOS '{validation.qos}' is a user QOS: corectl adds the validation QOS itself, under a name of its own"
            )
            problems.append(Problem(("health", "validation", "qos"), why))
    return problems


def _check_logs(config: ClusterConfig, names: set[str]) -> list[Problem]:
    if config.logs is not None and config.logs.host is not None and config.logs.host not in names:
        return [Problem(("logs", "host"), f"'{config.logs.host}' is not a node of this cluster")]
    return []


def _check_backup(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    if config.backup is not None and not config.slurm.accounting:
        return [Problem(("backup",), "needs slurm.accounting (a backup holds the accounting database)")]
    if config.backup is not None and config.backup.prometheus:
        # the backup runs on the database's host and reads the snapshot Prometheus writes into its own data directory
        database = [n.name for n in nodes if "slurm_dbd" in n.roles]
        monitoring = [n.name for n in nodes if "monitoring" in n.roles]
        if not config.monitoring.prometheus or not monitoring:
            return [Problem(("backup", "prometheus"), "needs monitoring.prometheus on a node of role monitoring")]
        if monitoring != database:
            why = f"Prometheus runs on {', '.join(monitoring)}, the backups on {', '.join(database)}: they must be one"
            return [Problem(("backup", "prometheus"), why + " host (the snapshot is read from Prometheus's own disk)")]
    return []


def _check_failover(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    """A backup controller is a declared node other than the controller, and the state both read is shared."""
    backup = config.slurm.backup_controller
    if backup is None:
        return []
    controllers = [n.name for n in nodes if "slurm_controller" in n.roles]
    if backup not in {n.name for n in nodes}:
        return [Problem(("slurm", "backup_controller"), f"'{backup}' is not a node of this cluster")]
    if backup in controllers:
        return [Problem(("slurm", "backup_controller"), f"'{backup}' is the controller itself (name another node)")]
    mountpoints = [m.mountpoint for m in config.cephfs.mounts] if config.cephfs else []
    state = config.slurm.state_dir
    shared = state is not None and any(PurePosixPath(m) in PurePosixPath(state).parents for m in mountpoints)
    if not shared:
        where = f"'{state}' is not" if state else "needs slurm.state_dir"
        why = f"{where} under a cephfs mountpoint ({', '.join(mountpoints) or 'none declared'}): both controllers"
        return [Problem(("slurm", "state_dir") if state else ("slurm", "backup_controller"), why + " must see it")]
    return []


def _check_alerts(config: ClusterConfig) -> list[Problem]:
    alerts = config.monitoring.alerts
    if alerts is None:
        return []
    base = ("monitoring", "alerts")
    if not config.monitoring.prometheus:
        return [Problem(base, "needs monitoring.prometheus (Prometheus sends the alerts)")]
    problems = duplicates(
        ((r.name, (*base, "receivers", i, "name")) for i, r in enumerate(alerts.receivers)), "receiver name"
    )
    names = {r.name for r in alerts.receivers}
    for path, name in [((*base, "receiver"), alerts.receiver)] + [
        ((*base, "routes", i, "receiver"), route.receiver) for i, route in enumerate(alerts.routes)
    ]:
        if name not in names:
            problems.append(Problem(path, f"unknown receiver '{name}' (declared: {', '.join(sorted(names))})"))
    for i, route in enumerate(alerts.routes):
        if not route.severity and not route.alerts:
            problems.append(Problem((*base, "routes", i), "names no severity and no alerts (it would take every one)"))
    for i, receiver in enumerate(alerts.receivers):
        if not receiver.email and not receiver.webhook:
            problems.append(Problem((*base, "receivers", i), f"receiver '{receiver.name}' has no email and no webhook"))
        if receiver.email and alerts.smtp is None:
            problems.append(Problem((*base, "receivers", i, "email"), "e-mail needs monitoring.alerts.smtp"))
    return problems


def _check_control(config: ClusterConfig) -> list[Problem]:
    if config.control is None:
        return []
    runners = config.control.runners
    problems = duplicates(((r.name, ("control", "runners", i, "name")) for i, r in enumerate(runners)), "runner name")
    problems += duplicates(
        ((f"{r.host}:{r.port}", ("control", "runners", i, "host")) for i, r in enumerate(runners)), "runner endpoint"
    )
    if config.cluster.ssh.key is None:
        needs = "runners need cluster.ssh.key (the key their jobs take to the nodes)"
        problems.append(Problem(("control", "runners"), needs))
    return problems


def _check_node_local(config: ClusterConfig) -> list[Problem]:
    """node_local.mode "on" is refused on a site that can not run node-local (auto runs such a site from here)."""
    return node_local_needs(config) if config.node_local.mode == "on" else []


def node_local_needs(config: ClusterConfig) -> list[Problem]:
    """What node-local jobs need of the site, unmet: they log in with the site's key as root (they install under
    /var/lib and run as the login user)."""
    problems: list[Problem] = []
    if config.cluster.ssh.key is None:
        needs = "node-local runs need cluster.ssh.key (the key their jobs use)"
        problems.append(Problem(("node_local", "mode"), needs))
    if config.cluster.ssh.user != "root":
        why = f"node-local runs log in as root (cluster.ssh.user is '{config.cluster.ssh.user}')"
        problems.append(Problem(("cluster", "ssh", "user"), why))
    for i, entry in enumerate(config.nodes):
        if entry.ssh is not None and entry.ssh.user not in (None, "root"):
            why = f"node-local runs log in as root (this node's ssh.user is '{entry.ssh.user}')"
            problems.append(Problem(("nodes", i, "ssh", "user"), why))
    return problems


def _check_profiles(config: ClusterConfig) -> list[Problem]:
    """A GPU-to-socket map names one socket of the profile for each GPU."""
    problems: list[Problem] = []
    for name, profile in config.profiles.items():
        gpus = profile.gpus
        if gpus is None or gpus.sockets is None:
            continue
        path: PathKey = ("profiles", name, "gpus", "sockets")
        if len(gpus.sockets) != gpus.count:
            problems.append(Problem(path, f"names {len(gpus.sockets)} sockets for {gpus.count} GPUs (one per GPU)"))
        elif max(gpus.sockets) >= profile.sockets:
            problems.append(
                Problem(path, f"socket {max(gpus.sockets)} does not exist (the profile has {profile.sockets}, from 0)")
            )
    return problems


def _check_cluster(config: ClusterConfig) -> list[Problem]:
    try:
        zoneinfo.ZoneInfo(config.cluster.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return [Problem(("cluster", "timezone"), f"unknown time zone '{config.cluster.timezone}'")]
    return []


def _check_nodes(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    for index, entry in enumerate(config.nodes):
        if entry.profile not in config.profiles:
            problems.append(unknown(("nodes", index, "profile"), "profile", entry.profile, config.profiles))
        if len(set(entry.roles)) != len(entry.roles):
            problems.append(Problem(("nodes", index, "roles"), "a role is listed twice"))
    problems += duplicates(((n.name, ("nodes", n.source, "name")) for n in nodes), "node name")
    problems += duplicates(((n.address, ("nodes", n.source, "address")) for n in nodes), "node address")
    problems += duplicates(
        ((f"{n.bmc.address}:{n.bmc.port}", ("nodes", n.source, "bmc", "address")) for n in nodes if n.bmc),
        "BMC address",
    )
    if not problems:
        problems += duplicates(
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
    problems += duplicates(
        ((s.name, ("fabric", "switches", i, "name")) for i, s in enumerate(fabric.switches)), "switch name"
    )
    for i, switch in enumerate(fabric.switches):
        for j, child in enumerate(switch.switches):
            if child not in switches:
                problems.append(unknown(("fabric", "switches", i, "switches", j), "switch", child, switches))
            elif child == switch.name:
                problems.append(Problem(("fabric", "switches", i, "switches", j), "a switch cannot contain itself"))
    looped = _in_loops(switches)
    for i, switch in enumerate(fabric.switches):
        if switch.name in looped:
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
            problems.append(unknown(("nodes", index, "leaf"), "switch", entry.leaf, switches))
        elif target.switches:
            problems.append(
                Problem(("nodes", index, "leaf"), f"'{entry.leaf}' has switches below it, so it is not a leaf")
            )
    used_leaves = {n.leaf for n in nodes if n.leaf}
    for i, switch in enumerate(fabric.switches):
        if not switch.switches and switch.name not in used_leaves:
            problems.append(Problem(("fabric", "switches", i, "name"), f"leaf switch '{switch.name}' has no nodes"))
    return problems


def _in_loops(switches: dict[str, Switch]) -> set[str]:
    """Switches that can reach themselves: Tarjan's strongly connected components, iteratively
    (a chain of thousands of switches must neither recurse too deep nor take quadratic time)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    looped: set[str] = set()
    edges = {name: [c for c in switch.switches if c in switches] for name, switch in switches.items()}
    for root in switches:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            name, child_at = work.pop()
            if child_at == 0:
                index[name] = low[name] = len(index)
                stack.append(name)
                on_stack.add(name)
            children = edges[name]
            if child_at < len(children):
                work.append((name, child_at + 1))
                child = children[child_at]
                if child == name:
                    looped.add(name)
                elif child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[name] = min(low[name], index[child])
                continue
            if low[name] == index[name]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == name:
                        break
                if len(component) > 1:
                    looped.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[name])
    return looped


def _check_identities(config: ClusterConfig) -> list[Problem]:
    problems: list[Problem] = []
    groups = {g.name for g in config.groups}
    problems += duplicates(((g.name, ("groups", i, "name")) for i, g in enumerate(config.groups)), "group name")
    problems += duplicates(((g.gid, ("groups", i, "gid")) for i, g in enumerate(config.groups)), "gid")
    problems += duplicates(((u.name, ("users", i, "name")) for i, u in enumerate(config.users)), "user name")
    problems += duplicates(((u.uid, ("users", i, "uid")) for i, u in enumerate(config.users)), "uid")
    for i, user in enumerate(config.users):
        if user.group not in groups:
            problems.append(unknown(("users", i, "group"), "group", user.group, groups))
        for j, extra in enumerate(user.groups):
            if extra not in groups:
                problems.append(unknown(("users", i, "groups", j), "group", extra, groups))
    return problems


def _check_storage(config: ClusterConfig) -> list[Problem]:
    if config.cephfs is None:
        return []
    mounts = config.cephfs.mounts
    return duplicates(
        ((m.mountpoint, ("cephfs", "mounts", i, "mountpoint")) for i, m in enumerate(mounts)), "mountpoint"
    )

"""cluster.yml's slurm section checked against the rest: partitions, nodes and QOS names, TRES, the
accounting tree (parents, cycles, QOS each account may use)."""

from __future__ import annotations

from corectl import hostlist
from corectl.site.model import ClusterConfig, Node
from corectl.site.model_slurm import Partition
from corectl.site.problems import Problem, duplicates, unknown
from corectl.site.yamlsrc import PathKey

# names all partitions may list together (each at most MAX_NODES): bounds the membership checks
MAX_PARTITION_NAMES = 1_000_000


def check_slurm(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    problems: list[Problem] = []
    by_name = {n.name: n for n in nodes}
    groups = {g.name for g in config.groups}
    partitions = config.slurm.partitions
    problems += duplicates(
        ((p.name, ("slurm", "partitions", i, "name")) for i, p in enumerate(partitions)), "partition name"
    )
    defaults = [i for i, p in enumerate(partitions) if p.default]
    for i in defaults[1:]:
        problems.append(Problem(("slurm", "partitions", i, "default"), "more than one default partition"))
    budget = MAX_PARTITION_NAMES
    pools: dict[str, str] = {}
    for i, partition in enumerate(partitions):
        path = ("slurm", "partitions", i, "nodes")
        try:
            members = hostlist.expand(partition.nodes, limit=min(hostlist.MAX_NODES, budget))
        except hostlist.TooManyNames as exc:
            total = f"partitions list more than {MAX_PARTITION_NAMES:,} node names in all"
            problems.append(Problem(path, total if budget < hostlist.MAX_NODES else str(exc)))
            break
        except hostlist.HostlistError as exc:
            problems.append(Problem(path, str(exc)))
            continue
        budget -= len(members)
        unknown = [m for m in members if m not in by_name]
        if unknown:
            more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
            problems.append(Problem(path, f"unknown node '{unknown[0]}'{more}"))
        other = [m for m in members if m in by_name and "compute" not in by_name[m].roles]
        if other:
            more = f" (and {len(other) - 1} more)" if len(other) > 1 else ""
            problems.append(Problem(path, f"node '{other[0]}' is not a compute node{more}"))
        for j, group in enumerate(partition.allow_groups):
            if group not in groups:
                problems.append(unknown(("slurm", "partitions", i, "allow_groups", j), "group", group, groups))
        problems += _check_spares(i, partition, members, set(by_name), pools)
    return problems


def _check_spares(
    i: int, partition: Partition, members: list[str], declared: set[str], pools: dict[str, str]
) -> list[Problem]:
    """A partition's spares: declared nodes of the partition, fewer than its nodes, each in one pool (``pools``: the
    spares of the partitions before this one, each with its partition, added to)."""
    if partition.spares is None:
        return []
    path: PathKey = ("slurm", "partitions", i, "spares", "nodes" if partition.spares.nodes is not None else "count")
    try:
        names = partition.spare_names()
    except hostlist.HostlistError as exc:
        return [Problem(path, str(exc))]
    problems = []
    for name in names:
        if name not in declared:
            problems.append(Problem(path, f"spare '{name}' is not a declared node"))
        elif name not in members:
            problems.append(Problem(path, f"spare '{name}' is not a node of partition {partition.name}"))
        elif name in pools:
            problems.append(Problem(path, f"spare '{name}' is already a spare of partition {pools[name]}"))
        else:
            pools[name] = partition.name
    if len(names) >= len(members):
        many = f"{len(names)} spares for the {len(members)} nodes of partition {partition.name}"
        problems.append(Problem(path, f"{many}: at least one must be in service"))
    return problems


# TRES a limit may name (AccountingStorageTRES=gres/gpu adds the GPUs to Slurm's defaults)
TRES_NAMES = ("billing", "cpu", "gres/gpu", "mem", "node")
# TRES a partition's billing weights may name (billing is what they compute)
BILLING_TRES = ("cpu", "gres/gpu", "mem", "node")


def _account_cycles(parents: dict[str, str]) -> dict[str, list[str]]:
    """Accounts on a parent cycle, each with its cycle from itself (a -> b -> a); each account has
    one parent, so a walk up either ends (root, unknown) or closes a cycle, and every account is
    walked once."""
    done: set[str] = set()
    cycles: dict[str, list[str]] = {}
    for start in parents:
        path: list[str] = []
        on_path: dict[str, int] = {}
        name: str | None = start
        while name is not None and name in parents and name not in done and name not in on_path:
            on_path[name] = len(path)
            path.append(name)
            name = parents[name]
        if name is not None and name in on_path:
            cycle = path[on_path[name] :]
            for i, member in enumerate(cycle):
                cycles[member] = [*cycle[i:], *cycle[:i], member]
        done.update(path)
    return cycles


def _check_tres(
    path: PathKey, limits: dict[str, int], total_gpus: int, known: tuple[str, ...] = TRES_NAMES
) -> list[Problem]:
    problems = []
    for tres, count in limits.items():
        if tres not in known:
            problems.append(Problem((*path, tres), f"unknown TRES '{tres}' (known: {', '.join(known)})"))
        elif tres == "gres/gpu" and count > total_gpus:
            problems.append(
                Problem((*path, tres), f"{count} GPUs is more than the cluster has ({total_gpus} on compute nodes)")
            )
    return problems


def check_accounting(config: ClusterConfig, nodes: list[Node]) -> list[Problem]:
    """QOS, accounts and users' accounts: names, references, the account tree, limits."""
    slurm = config.slurm
    problems: list[Problem] = []
    total_gpus = 0
    for node in nodes:
        profile = config.profiles.get(node.profile)
        if "compute" in node.roles and profile is not None and profile.gpus is not None:
            total_gpus += profile.gpus.count
    for i, partition in enumerate(slurm.partitions):
        if partition.billing_weights:
            path = ("slurm", "partitions", i, "billing_weights")
            problems += _check_tres(path, {k: 0 for k in partition.billing_weights}, total_gpus, BILLING_TRES)
    if not slurm.accounting:
        for key in ("qos", "accounts"):
            if getattr(slurm, key):
                problems.append(Problem(("slurm", key), f"{key} need accounting (slurm.accounting is false)"))
    qos_names = {q.name for q in slurm.qos}
    known_qos = qos_names | {"normal"}  # Slurm's own QOS, always there
    problems += duplicates(((q.name, ("slurm", "qos", i, "name")) for i, q in enumerate(slurm.qos)), "QOS name")
    for i, qos in enumerate(slurm.qos):
        for j, target in enumerate(qos.preempt):
            path = ("slurm", "qos", i, "preempt", j)
            if target == qos.name:
                problems.append(Problem(path, f"QOS '{qos.name}' cannot preempt itself"))
            elif target not in known_qos:
                problems.append(unknown(path, "QOS", target, known_qos))
        if len(set(qos.preempt)) != len(qos.preempt):
            problems.append(Problem(("slurm", "qos", i, "preempt"), "a QOS is listed twice"))
        for key in ("grp_tres", "max_tres_per_user"):
            problems += _check_tres(("slurm", "qos", i, key), getattr(qos, key), total_gpus)
    accounts = slurm.accounts
    problems += duplicates(((a.name, ("slurm", "accounts", i, "name")) for i, a in enumerate(accounts)), "account name")
    groups = {g.name for g in config.groups}
    declared = {a.name: a for a in accounts}
    # every group not declared is an account under root (as corectl always made them)
    known_accounts = set(declared) | groups
    for i, account in enumerate(accounts):
        base = ("slurm", "accounts", i)
        if account.name == "root":
            problems.append(Problem((*base, "name"), "'root' is Slurm's own account (the top of the tree)"))
        if account.parent != "root" and account.parent not in known_accounts:
            problems.append(unknown((*base, "parent"), "account", account.parent, known_accounts | {"root"}))
        if account.fairshare < 1:
            what = "a negative share" if account.fairshare < 0 else "a share of 0"
            problems.append(Problem((*base, "fairshare"), f"{what} is refused: fairshare is at least 1"))
        for j, name in enumerate(account.qos):
            if name not in known_qos:
                problems.append(unknown((*base, "qos", j), "QOS", name, known_qos))
        if len(set(account.qos)) != len(account.qos):
            problems.append(Problem((*base, "qos"), "a QOS is listed twice"))
        if account.default_qos is not None:
            allowed = _allowed_qos(account.name, declared)
            if account.default_qos not in known_qos:
                problems.append(unknown((*base, "default_qos"), "QOS", account.default_qos, known_qos))
            elif account.default_qos not in allowed:
                where = "its qos list" if account.qos else "the qos list it inherits"
                problems.append(
                    Problem(
                        (*base, "default_qos"),
                        f"default_qos '{account.default_qos}' is not in {where} ({', '.join(sorted(allowed))})",
                    )
                )
        for key in ("grp_tres", "max_tres_per_user"):
            problems += _check_tres((*base, key), getattr(account, key), total_gpus)
    cycles = _account_cycles({a.name: a.parent for a in accounts if a.name != a.parent})
    for i, account in enumerate(accounts):
        if account.name == account.parent:
            problems.append(Problem(("slurm", "accounts", i, "parent"), "an account cannot be its own parent"))
        elif account.name in cycles and declared.get(account.name) is account:
            chain = " -> ".join(cycles[account.name])
            problems.append(Problem(("slurm", "accounts", i, "parent"), f"accounts form a cycle ({chain})"))
    for i, user in enumerate(config.users):
        for j, name in enumerate(user.slurm_accounts):
            if name not in known_accounts:
                problems.append(unknown(("users", i, "slurm_accounts", j), "account", name, known_accounts))
        if len(set(user.slurm_accounts)) != len(user.slurm_accounts):
            problems.append(Problem(("users", i, "slurm_accounts"), "an account is listed twice"))
    return problems


def _allowed_qos(name: str, declared: dict) -> set[str]:
    """The QOS an account's jobs may use: its own list, else the nearest declared ancestor's,
    else root's (Slurm's normal)."""
    seen: set[str] = set()
    while name in declared and name not in seen:
        seen.add(name)
        if declared[name].qos:
            return set(declared[name].qos)
        name = declared[name].parent
    return {"normal"}

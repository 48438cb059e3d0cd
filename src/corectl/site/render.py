"""Render a validated Cluster into the Ansible inventory (inventories/<site>/hosts.yml).

The output is a pure function of cluster.yml: sorted, stable, no timestamps, so a stale file is
detected by comparing bytes (``corectl render --check``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corectl import hostlist
from corectl.files import write_if_changed
from corectl.node_state import SPARES_RESERVATION
from corectl.site.model import ROLES, Cluster, ClusterConfig, Fabric, Node, Profile, User
from corectl.site.model_slurm import DEFAULT_STATE_DIR, Account, Qos


def _key_path(key: str | None) -> str | None:
    """Relative key paths are relative to the inventory directory (Ansible's inventory_dir)."""
    if key is None or key.startswith(("/", "~")):
        return key
    return "{{ inventory_dir }}/" + key


def profile_vars(profile: Profile) -> dict[str, Any]:
    data = profile.model_dump(exclude={"description"})
    data["cpus"] = profile.sockets * profile.cores_per_socket * profile.threads_per_core
    return data


def gpu_sockets(profile: Profile) -> list[int] | None:
    """The CPU socket of each GPU, by index: as declared, else the GPUs split evenly over the
    sockets in index order (DGX H100: 0-3 on socket 0, 4-7 on socket 1); None when the profile
    has no GPUs or they do not split evenly (no binding is then declared)."""
    gpus = profile.gpus
    if gpus is None:
        return None
    if gpus.sockets is not None:
        return list(gpus.sockets)
    if gpus.count % profile.sockets:
        return None
    per_socket = gpus.count // profile.sockets
    return [index // per_socket for index in range(gpus.count)]


def gpu_bindings(profile: Profile) -> list[dict[str, str]]:
    """gres.conf lines of a profile: each run of GPUs on one socket with that socket's cores, in
    Slurm's logical core numbering (socket s holds cores s*cores_per_socket and up, whatever OS
    CPU numbers the kernel gives their threads)."""
    sockets = gpu_sockets(profile)
    if sockets is None:
        return []
    runs: list[tuple[int, int, int]] = []  # (first GPU, last GPU, socket)
    for index, socket in enumerate(sockets):
        if runs and runs[-1][2] == socket and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index, socket)
        else:
            runs.append((index, index, socket))
    per = profile.cores_per_socket
    return [
        {
            "file": f"/dev/nvidia{first}" if first == last else f"/dev/nvidia[{first}-{last}]",
            "cores": f"{socket * per}" if per == 1 else f"{socket * per}-{socket * per + per - 1}",
        }
        for first, last, socket in runs
    ]


def def_cpu_per_gpu(members: list[Profile]) -> int | None:
    """A GPU partition's DefCpuPerGPU: the fewest CPUs per GPU of its nodes' profiles, so a GPU
    job without -c gets its share of cores (and, through DefMemPerCPU, of memory); None where a
    member has no GPUs or fewer CPUs than GPUs."""
    shares = [profile_vars(p)["cpus"] // p.gpus.count if p.gpus else 0 for p in members]
    share = min(shares, default=0)
    return share if share >= 1 else None


def group_name(kind: str, name: str) -> str:
    return f"{kind}_{name.replace('-', '_')}"


def host_vars(cluster: Cluster, node: Node) -> dict[str, Any]:
    ssh = cluster.config.cluster.ssh
    data: dict[str, Any] = {
        "ansible_host": node.ssh_host,
        "corectl_address": node.address,
        "corectl_profile": node.profile,
        "corectl_roles": list(node.roles),
    }
    if node.ssh_port != 22:
        data["ansible_port"] = node.ssh_port
    if node.ssh_user != ssh.user:
        data["ansible_user"] = node.ssh_user
    if node.jump_host and node.jump_host != ssh.jump_host:
        data["ansible_ssh_common_args"] = " ".join(ssh.client_options(node.jump_host))  # (validated: no spaces)
    if node.rack:
        data["corectl_rack"] = node.rack
    if node.leaf:
        data["corectl_leaf"] = node.leaf
    return data


def slurm_vars(cluster: Cluster) -> dict[str, Any]:
    """cluster.yml in the shape slurm.conf wants: node lines per profile, partitions, accounts."""
    config = cluster.config
    profiles = config.profiles
    computes = [n for n in cluster.nodes if "compute" in n.roles]
    node_groups = []
    for name in sorted({n.profile for n in computes}):
        profile = profiles[name]
        hw = profile_vars(profile)
        node_groups.append(
            {
                "nodes": hostlist.compress([n.name for n in computes if n.profile == name]),
                "cpus": hw["cpus"],
                "sockets": profile.sockets,
                "cores_per_socket": profile.cores_per_socket,
                "threads_per_core": profile.threads_per_core,
                "memory_mb": profile.memory_mb,
                "gpu": {**profile.gpus.model_dump(), "bindings": gpu_bindings(profile)} if profile.gpus else None,
                "scratch": profile.scratch,
            }
        )
    by_name = {n.name: n for n in cluster.nodes}
    partitions = []
    for partition in config.slurm.partitions:
        members = [by_name[name] for name in hostlist.expand(partition.nodes)]
        per_cpu = min(profile_vars(profiles[n.profile])["cpus"] for n in members)
        partitions.append(
            {
                **partition.model_dump(exclude={"spares"}),
                "nodes": hostlist.compress([n.name for n in members]),
                # jobs share nodes: without a default, each job would take a whole node's memory
                "def_mem_per_cpu": min(profiles[n.profile].memory_mb for n in members) // per_cpu,
                "def_cpu_per_gpu": def_cpu_per_gpu([profiles[n.profile] for n in members]),
                "billing_weights": billing_weights(partition.billing_weights, [profiles[n.profile] for n in members]),
            }
        )
    dbd = cluster.with_role("slurm_dbd")
    return {
        "cluster_name": config.cluster.name,
        "controller": cluster.with_role("slurm_controller")[0].name,
        "backup_controller": config.slurm.backup_controller or "",
        "state_dir": config.slurm.state_dir or DEFAULT_STATE_DIR,
        "controller_timeout_s": config.slurm.controller_timeout_s,
        "dbd_host": dbd[0].name if dbd and config.slurm.accounting else "",
        "accounting": config.slurm.accounting,
        "pam_slurm_adopt": config.slurm.pam_slurm_adopt,
        "requeue_on_hardware_failure": config.slurm.requeue_on_hardware_failure,
        "spares": [
            {
                "partition": p.name,
                "reservation": f"{SPARES_RESERVATION}{p.name}",
                "nodes": p.spare_names(),
                "repaired": p.spares.repaired,
            }
            for p in config.slurm.partitions
            if p.spares is not None
        ],
        "node_groups": node_groups,
        "partitions": partitions,
        "priority": config.slurm.priority.model_dump(),
        "qos": qos_list(config),
        "accounts": accounts(config),
        "users": [
            {
                "name": u.name,
                "default_account": user_accounts(u)[0],
                "accounts": user_accounts(u),
                "admin": u.admin,
                "state": u.state,
            }
            for u in config.users
        ],
    }


def qos_list(config: ClusterConfig) -> list[dict[str, Any]]:
    """The declared QOS; with validation on, its QOS as well (no priority, its jobs cancelled when preempted) and
    every other QOS, normal included, preempting it: any user's job goes before a validation job."""
    declared = [q.model_dump() for q in config.slurm.qos]
    validation = config.health.validation
    if validation is None or not config.slurm.accounting:
        return declared
    if not any(q["name"] == "normal" for q in declared):
        declared.insert(0, Qos(name="normal", description="Normal QOS default").model_dump())
    for q in declared:
        q["preempt"] = [*q["preempt"], validation.qos]
    description = "corectl: validation of idle nodes (preempted by every other QOS)"
    return [*declared, Qos(name=validation.qos, description=description, preempt_mode="cancel").model_dump()]


def user_accounts(user: User) -> list[str]:
    """A user's Slurm accounts, the default first: as declared, else the primary group and then
    the supplementary groups."""
    return list(dict.fromkeys(user.slurm_accounts or [user.group, *user.groups]))


def accounts(config: ClusterConfig) -> list[dict[str, Any]]:
    """The account tree, each parent before its children (declared order among siblings): the
    declared accounts, and each group not declared as an account under root with one share."""
    declared = {a.name: a for a in config.slurm.accounts}
    implicit = [Account(name=g.name) for g in config.groups if g.name not in declared]
    every = [*config.slurm.accounts, *implicit]
    children: dict[str, list[Account]] = {}
    for account in every:
        children.setdefault(account.parent, []).append(account)
    ordered: list[dict[str, Any]] = []
    stack = list(reversed(children.get("root", [])))
    while stack:
        account = stack.pop()
        ordered.append({**account.model_dump(), "description": account.description or account.name})
        stack.extend(reversed(children.get(account.name, [])))
    return ordered


def _number(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".")


BILLING_KEYS = {"cpu": "CPU", "mem": "Mem", "node": "Node", "gres/gpu": "GRES/gpu"}


def billing_weights(declared: dict[str, float] | None, members: list[Profile]) -> str:
    """A partition's TRESBillingWeights ("" for Slurm's default, CPUs only). Default, where the
    partition has GPU nodes: from its most common GPU profile, a CPU weighs 1 and the node's
    memory, or its GPUs, weigh as much as all its CPUs (a 224-CPU node with 8 GPUs: 28 a GPU), so
    a job is billed the share of the node it takes of each, in CPUs."""
    if declared is None:
        gpu_profiles = [p for p in members if p.gpus is not None]
        if not gpu_profiles:
            return ""
        counts: dict[int, int] = {}
        for profile in gpu_profiles:
            counts[id(profile)] = counts.get(id(profile), 0) + 1
        profile = max(gpu_profiles, key=lambda p: counts[id(p)])
        assert profile.gpus is not None
        cpus = profile_vars(profile)["cpus"]
        declared = {"cpu": 1.0, "mem": cpus / (profile.memory_mb / 1024), "gres/gpu": cpus / profile.gpus.count}
    parts = []
    for key, slurm_name in BILLING_KEYS.items():
        if key in declared:
            parts.append(f"{slurm_name}={_number(declared[key])}{'G' if key == 'mem' else ''}")
    return ",".join(parts)


def fabric_vars(fabric: Fabric) -> dict[str, Any]:
    """The fabric as roles see it: its kind and rate, whether it carries RDMA, and the NCCL
    settings every job on it gets (role rdma)."""
    nccl: dict[str, str] = {}
    if fabric.hcas:
        nccl["NCCL_IB_HCA"] = ",".join(fabric.hcas)
    if fabric.socket_interface:
        nccl["NCCL_SOCKET_IFNAME"] = fabric.socket_interface
    nccl.update(fabric.nccl)
    return {
        "kind": fabric.kind,
        "rate_gbps": fabric.rate_gbps,
        "rdma": fabric.kind in ("infiniband", "roce"),
        "nccl": nccl,
    }


def site_vars(cluster: Cluster) -> dict[str, Any]:
    """site.json: cluster.yml's site-wide settings that roles read, passed to every run as extra
    vars (corectl.ansible.runner). In hosts.yml's all.vars, `ansible-inventory --list` would repeat them
    under every host."""
    config = cluster.config
    data: dict[str, Any] = {
        "corectl_cluster": config.cluster.model_dump(exclude={"ssh"}),
        "corectl_slurm": slurm_vars(cluster),
        "corectl_groups": [g.model_dump() for g in config.groups],
        "corectl_users": [u.model_dump() for u in config.users],
        "corectl_monitoring": config.monitoring.model_dump(),
        "corectl_health": {
            "xid_classes": {str(x): c for x, c in sorted(config.health.xid_classes.items())},
            "thresholds": dict(sorted(config.health.thresholds.items())),
            "validation": config.health.validation.model_dump() if config.health.validation else None,
        },
    }
    data["corectl_backup"] = config.backup.model_dump() if config.backup else None
    data["corectl_logs"] = logs_vars(cluster)
    if config.fabric is not None:
        data["corectl_fabric"] = fabric_vars(config.fabric)
    if config.cephfs is not None:
        data["corectl_cephfs"] = config.cephfs.model_dump()
    return data


def logs_vars(cluster: Cluster) -> dict[str, Any] | None:
    """cluster.yml's logs with its host resolved (the Slurm controller unless named); None: off."""
    logs = cluster.config.logs
    if logs is None:
        return None
    host = logs.host or cluster.with_role("slurm_controller")[0].name
    return {**logs.model_dump(), "host": host, "address": next(n.address for n in cluster.nodes if n.name == host)}


def cluster_vars(cluster: Cluster) -> dict[str, Any]:
    """hosts.yml's all.vars: how Ansible logs in, and where the site's other rendered files are."""
    config = cluster.config
    ssh = config.cluster.ssh
    data: dict[str, Any] = {
        "ansible_user": ssh.user,
        # not here, where every host would carry them (ansible-inventory --list repeats all.vars
        # under each host): the site-wide settings (site.json, extra vars of every run) and the
        # lists that grow with the cluster (nodes.json, switches.json, read where a role uses them)
        "corectl_nodes_file": "{{ inventory_dir }}/nodes.json",
        # vault-encrypted files made by `corectl secrets init` (munge.key, secrets.yml)
        "corectl_secrets_dir": "{{ inventory_dir }}/secrets",
    }
    key = _key_path(ssh.key)
    if key is not None:
        data["ansible_ssh_private_key_file"] = key
    if options := ssh.client_options(ssh.jump_host):
        data["ansible_ssh_common_args"] = " ".join(options)  # (validated: no spaces)
    if config.fabric is not None:
        data["corectl_switches_file"] = "{{ inventory_dir }}/switches.json"
    return data


def inventory(cluster: Cluster) -> dict[str, Any]:
    children: dict[str, Any] = {}
    for role in ROLES:
        members = [n.name for n in cluster.nodes if role in n.roles]
        if members:
            children[role] = {"hosts": {name: None for name in members}}
    # the second slurmctld (cluster.yml slurm.backup_controller): the controller's play runs on it too
    if cluster.config.slurm.backup_controller:
        children["slurm_backup_controller"] = {"hosts": {cluster.config.slurm.backup_controller: None}}
    # GPU nodes (driver, DCGM, dcgm-exporter): every node whose profile declares GPUs
    gpu_nodes = [n.name for n in cluster.with_gpus()]
    if gpu_nodes:
        children["gpu"] = {"hosts": {name: None for name in gpu_nodes}}
    # compute nodes whose GPUs slurmd finds through NVML: checked before a run changes anything
    profiles = cluster.config.profiles
    nvml = [
        n.name
        for n in cluster.with_gpus()
        if "compute" in n.roles and getattr(profiles[n.profile].gpus, "autodetect", "off") == "nvml"
    ]
    if nvml:
        children["gpu_nvml"] = {"hosts": {name: None for name in nvml}}
    # a profile's hardware once, as its group's variables (not repeated under each of its hosts)
    for profile in sorted(cluster.config.profiles):
        members = [n.name for n in cluster.nodes if n.profile == profile]
        if members:
            children[group_name("profile", profile)] = {
                "hosts": {name: None for name in members},
                "vars": {"corectl_hw": profile_vars(cluster.config.profiles[profile])},
            }
    return {
        "all": {
            "hosts": {n.name: host_vars(cluster, n) for n in cluster.nodes},
            "children": children,
            "vars": cluster_vars(cluster),
        }
    }


def render_text(cluster: Cluster) -> str:
    """hosts.yml as pure JSON, which is YAML to Ansible's inventory plugin.

    PyYAML's emitter took 6 s for 1,000 nodes (most of a minute for 10,000); json a fraction of a
    second. No comment line either: Ansible's loader tries JSON first and falls back to its YAML
    parser for anything else, so a "generated, do not edit" header cost every run that reads the
    file a YAML parse (ansible-inventory --list --export at 10,000 nodes: 8.5 s with it, 3.1 s
    without; docs/performance.md). `corectl render --check` finds a hand-edited file instead.
    """
    return json.dumps(inventory(cluster), indent=1, sort_keys=True) + "\n"


def nodes_text(cluster: Cluster) -> str:
    """nodes.json: every node's name, address, profile and roles (corectl_nodes in playbooks)."""
    nodes = [
        {"name": n.name, "address": n.address, "profile": n.profile, "roles": list(n.roles)} for n in cluster.nodes
    ]
    return _compact(nodes)


def switches(cluster: Cluster) -> list[dict[str, Any]]:
    """The fabric's switches as topology.conf wants them: a leaf's nodes as a host list."""
    fabric = cluster.config.fabric
    if fabric is None:
        return []
    leaves: dict[str, list[str]] = {}
    for node in cluster.nodes:
        if node.leaf:
            leaves.setdefault(node.leaf, []).append(node.name)
    return [
        {
            "name": s.name,
            "switches": list(s.switches),
            "nodes": hostlist.compress(leaves.get(s.name, [])) if not s.switches else "",
        }
        for s in fabric.switches
    ]


def _compact(data: object) -> str:
    return json.dumps(data, indent=None, separators=(",", ":")) + "\n"


def hosts_file(inventory_dir: Path) -> Path:
    return inventory_dir / "hosts.yml"


def nodes_file(inventory_dir: Path) -> Path:
    return inventory_dir / "nodes.json"


def rendered(cluster: Cluster, inventory_dir: Path) -> dict[Path, str]:
    """Every file render writes: hosts.yml, and the lists that grow with the cluster, which roles
    read where they use them (in hosts.yml's all.vars every host would carry them)."""
    return {
        hosts_file(inventory_dir): render_text(cluster),
        nodes_file(inventory_dir): nodes_text(cluster),
        inventory_dir / "switches.json": _compact(switches(cluster)),
        inventory_dir / "site.json": json.dumps(site_vars(cluster), indent=1, sort_keys=True) + "\n",
    }


def is_current(cluster: Cluster, inventory_dir: Path) -> bool:
    return all(
        path.is_file() and path.read_text(encoding="utf-8") == text
        for path, text in rendered(cluster, inventory_dir).items()
    )


def write(cluster: Cluster, inventory_dir: Path) -> bool:
    """Write hosts.yml, nodes.json, switches.json and site.json; return True when any changed."""
    changed = [write_if_changed(path, text) for path, text in rendered(cluster, inventory_dir).items()]
    return any(changed)

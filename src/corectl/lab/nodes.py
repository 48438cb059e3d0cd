"""Start and remove stand-in nodes, and write the lab site's inventory for them."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from corectl import hostlist
from corectl import secrets as site_secrets
from corectl.errors import CorectlError
from corectl.files import atomic_write, write_if_changed
from corectl.lab import bmc, repo
from corectl.lab.docker import LABEL, accounting_flags, docker, ensure_engine
from corectl.lab.image import DEFAULT_RELEASE, check_release, ensure_baked_image, ensure_image
from corectl.site import Site

# The flags measured to run systemd as PID 1 here (see docs/testing.md); molecule's shared
# base config (.config/molecule/config.yml) uses the same ones, and a unit test keeps them equal.
NODE_FLAGS: tuple[str, ...] = (
    "--cap-add=SYS_ADMIN",
    "--cap-add=SYS_NICE",
    "--cap-add=NET_ADMIN",  # the firewall role's nftables rules, in the container's own network namespace
    "--security-opt=seccomp=unconfined",
    "--security-opt=apparmor=unconfined",
    "--cgroupns=host",
    "--volume=/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs=/run",
    "--tmpfs=/run/lock",
    "--device=/dev/fuse",  # ceph-fuse (no kernel ceph module here)
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# A reboot inside a node ends its systemd (exit 0): Docker starts it again, like a machine coming
# back. A container its BMC stand-in killed (power off) stays off until the BMC starts it.
RESTART_POLICY = "--restart=unless-stopped"
# Where the containers started from now on begin: the bare node image (what `corectl lab up` gives an
# operator), or with CORECTL_LAB_NODE_IMAGE=baked the image with the roles' Debian packages in it: the
# end-to-end tests set it once their lab's first provision has proven the install from the bare image, so
# the nodes they add later skip the downloads and unpacking (issue 45; tests/standin/node-packages.yml).
NODE_IMAGE_ENV = "CORECTL_LAB_NODE_IMAGE"
NODE_IMAGES = ("bare", "baked")


@dataclass(frozen=True)
class LabNode:
    name: str
    address: str
    ssh_port: int
    head: bool


@dataclass(frozen=True)
class LabSpec:
    site: Site
    computes: int = 2
    subnet: str = "172.29.10.0/24"
    ssh_port_base: int = 22100
    # Slurm puts job cgroups in the host's tree as /slurm_<node>: two labs on one machine need
    # different node names (the end-to-end test uses its own prefix).
    prefix: str = ""
    # a stand-in Ceph cluster beside the nodes, mounted with ceph-fuse at /shared
    ceph: bool = False
    # runner host stand-ins (cluster.yml control.runners): runs fan out over them; a rack per DGX
    runners: int = 0
    # head stand-ins: head02 (address .9) is a second head for a backup controller (corectl lab add --head)
    heads: int = 1
    # the Debian release of the lab's stand-ins (corectl lab image --release), and of nodes added
    # with another one (corectl lab add --release): node name -> release
    release: str = DEFAULT_RELEASE
    releases: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            ipaddress.IPv4Network(self.subnet)
        except ValueError:
            raise CorectlError(
                f"--subnet {self.subnet}: not an IPv4 network such as 172.29.10.0/24", exit_code=2
            ) from None
        if not 1024 <= self.ssh_port_base <= 65535 - 64:
            raise CorectlError(f"--ssh-port-base {self.ssh_port_base}: choose a port from 1024 to 65471", exit_code=2)
        for release in (self.release, *self.releases.values()):
            check_release(release)

    def release_of(self, node: str) -> str:
        return self.releases.get(node, self.release)

    @property
    def network(self) -> str:
        return f"corectl-{self.site.name}"

    def ceph_address(self) -> str:
        return str(ipaddress.IPv4Network(self.subnet).network_address + 5)

    def repo_address(self) -> str:
        """The stand-in package repository's server (tests/standin)."""
        return str(ipaddress.IPv4Network(self.subnet).network_address + 6)

    def container(self, node: str) -> str:
        return f"corectl-{self.site.name}-{node}"

    def nodes(self) -> list[LabNode]:
        net = ipaddress.IPv4Network(self.subnet)
        if net.num_addresses < 16 + self.computes:
            raise CorectlError(f"--subnet {self.subnet} is too small for {self.computes + 1} nodes")
        out = [LabNode(f"{self.prefix}head01", str(net.network_address + 10), self.ssh_port_base, True)]
        for i in range(1, self.computes + 1):
            name = f"{self.prefix}dgx{i:02d}"
            out.append(LabNode(name, str(net.network_address + 10 + i), self.ssh_port_base + i, False))
        if self.heads > 1:  # last: the DGX keep their places (their BMCs' kinds follow them)
            out.append(LabNode(f"{self.prefix}head02", str(net.network_address + 9), self.ssh_port_base + 40, True))
        return out

    def runner_hosts(self) -> list[LabNode]:
        """Runner stand-ins: addresses from .40, SSH published 50 ports above the head's."""
        net = ipaddress.IPv4Network(self.subnet)
        return [
            LabNode(f"{self.prefix}runner{i}", str(net.network_address + 40 + i), self.ssh_port_base + 50 + i, False)
            for i in range(1, self.runners + 1)
        ]


LAB_USER = "alice"  # a declared user whose SSH key the lab keeps in .lab/ (try logins as a user)


def lab_cluster(spec: LabSpec, user_key: str | None = None) -> dict:
    """The lab's cluster.yml: a head node and N DGX stand-ins on one leaf switch.

    ``user_key``: the public SSH key declared for LAB_USER.
    """
    nodes = spec.nodes()[: 1 + spec.computes]  # a second head (lab add --head) is declared by the operator
    head = nodes[0]
    computes = [n.name for n in nodes if not n.head]
    compute_range = hostlist.compress(computes)
    return {
        "cluster": {
            "name": spec.site.name.replace("_", "-"),
            "domain": "lab.corectl.test",
            "timezone": "Europe/Berlin",
            "ntp_servers": [head.address],
            "ssh": {"user": "root", "key": ".lab/id_ed25519"},
            "environment": {"CORECTL_SITE": spec.site.name},
        },
        "profiles": {
            "dgx-standin": {
                "description": "systemd container standing in for a DGX H100 (GPUs simulated)",
                # the machine's two cores as two sockets of one core: GPUs 0-3 bind to socket 0's
                # core, 4-7 to socket 1's, as on a DGX H100 (the gres.conf Cores= test)
                "sockets": 2,
                "cores_per_socket": 1,
                "threads_per_core": 1,
                "memory_mb": 1024,
                "scratch": "/raid",
                "nvme_drives": 10,  # gpu-sim's stand-in drives (2 boot + 8 data, as a DGX H100)
                "gpudirect_rdma": True,
                "gpus": {"count": 8, "model": "h100", "nvswitch": True, "autodetect": "off"},
            },
            "head-standin": {
                "description": "systemd container standing in for the head node",
                "sockets": 1,
                "cores_per_socket": 2,
                "threads_per_core": 1,
                "memory_mb": 1024,
            },
        },
        "nodes": [
            {
                "name": n.name,
                "address": n.address,
                "profile": "head-standin" if n.head else "dgx-standin",
                "roles": ["slurm_controller", "slurm_dbd", "login", "monitoring"] if n.head else ["compute"],
                **({} if n.head else {"leaf": "leaf1", "bmc": bmc.declaration(n.address, index)}),
                **({"rack": f"rack{index}"} if spec.runners and not n.head else {}),
                "ssh": {"host": "127.0.0.1", "port": n.ssh_port},
            }
            for index, n in enumerate(nodes)
        ],
        "fabric": {
            "kind": "infiniband",
            "rate_gbps": 400,
            "switches": [{"name": "leaf1"}, {"name": "spine1", "switches": ["leaf1"]}],
            # the simulated HCAs (gpu-sim's sysfs) and the stand-ins' network interface
            "hcas": [f"mlx5_{i}" for i in range(8)],
            "socket_interface": "eth0",
            "nccl": {"NCCL_IB_GID_INDEX": "3"},
        },
        "slurm": {
            "accounting": True,
            "pam_slurm_adopt": True,
            "partitions": [{"name": "batch", "nodes": compute_range, "default": True}],
            # a declared accounting tree for the end-to-end test: fair share, a GPU cap, preemption
            "qos": [
                {"name": "high", "priority": 100, "preempt": ["low"]},
                {"name": "low"},
            ],
            "accounts": [
                {"name": "research", "fairshare": 10, "qos": ["normal", "high", "low"]},
                {"name": "vision", "parent": "research", "fairshare": 5, "grp_tres": {"gres/gpu": 4}},
                {"name": "hpcadmin"},
            ],
        },
        "groups": [{"name": "research", "gid": 20000}, {"name": "hpcadmin", "gid": 20001}],
        "users": [
            {
                "name": LAB_USER,
                "uid": 20001,
                "group": "research",
                # her default account, and the team's sub-account with its GPU cap
                "slurm_accounts": ["research", "vision"],
                **({"ssh_keys": [user_key]} if user_key else {}),
            },
            {"name": "carol", "uid": 20003, "group": "hpcadmin", "groups": ["research"], "admin": True},
        ],
        "monitoring": {
            "prometheus": True,
            "scrape_interval": "15s",
            "retention": "2d",
            # Grafana (the stand-in package) with corectl's dashboards
            "grafana": {"anonymous_viewers": True},
            # Alertmanager on the head; its mail goes nowhere (no relay on the lab's network): the e2e test reads
            # the silences corectl drain sets
            "alerts": {
                "receiver": "operators",
                "receivers": [{"name": "operators", "email": ["operators@lab.corectl.test"]}],
                "smtp": {"smarthost": "127.0.0.1:25", "sender": "alertmanager@lab.corectl.test", "require_tls": False},
            },
        },
        # chrony on a loaded 2-core machine can lose its (same-kernel) source for minutes: a longer grace
        "health": {
            "thresholds": {"clock_unsynced_grace_s": 600},
            # validation of idle nodes: the timers' rounds (single-node and pairwise) once a day (the e2e tests
            # start their services themselves, so no round lands in another test's jobs), any idle node, three at
            # once (a pairwise round needs three to tell the bad node of a bad pair), short jobs
            "validation": {
                "interval_min": 1440,
                "idle_min": 0,
                "max_nodes": 3,
                "time_limit_min": 10,
                "pairwise_interval_min": 1440,
            },
        },
        # backups of the head on CephFS (its own disk may die), two kept, Prometheus's data with them; the timer's
        # schedule is a day away (the e2e test starts its service itself)
        "backup": {"destination": "/shared/corectl-backups", "retention": 2, "schedule": "daily", "prometheus": True},
        # every node's logs on the head (the default log host), a week kept
        "logs": {"keep_days": 7},
        **(
            {
                "control": {
                    "runners": [{"name": r.name, "host": "127.0.0.1", "port": r.ssh_port} for r in spec.runner_hosts()],
                    "shard_by": "rack",
                    # runners sit on the lab network: they reach nodes at their addresses, not the
                    # ports published on this machine's loopback
                    "node_endpoint": "address",
                }
            }
            if spec.runners
            else {}
        ),
        **(
            {
                "cephfs": {
                    "monitors": [f"{spec.ceph_address()}:6789"],
                    "mounts": [
                        {"fs_name": "cephfs", "path": "/", "mountpoint": "/shared", "client": "corectl", "fuse": True}
                    ],
                }
            }
            if spec.ceph
            else {}
        ),
    }


# Stand-in containers differ from metal in a few measured ways; the lab's site group_vars
# say so explicitly (the roles' defaults stay right for real nodes).
LAB_GROUP_VARS = {
    # docker bind-mounts /etc/hosts into the container: it can be rewritten, not replaced
    "base_etc_hosts_unsafe_writes": True,
    # no CAP_SYS_TIME in a container: chronyd syncs and serves time without setting the clock
    "base_chrony_control_clock": False,
    # /proc/sys is read-only in a container: settings are written to sysctl.d, not applied live
    "base_sysctl_apply": False,
    "enroot_sysctl_apply": False,
    # no kernel modules in a container: the stand-in driver's `gpu-sim reload` plays the reload
    "nvidia_driver_activation": "reload",
    "nvidia_driver_reload_commands": [["gpu-sim", "reload"]],
    # the simulated GPUs' InfiniBand ports and kernel log (XID events) live in gpu-sim's files
    # short health interval: injected faults drain a node within half a minute (Slurm's health
    # check RPC waits for the program: on this 2-core machine a 10 s interval starved slurmd)
    "slurm_health_check_interval": 30,
    "node_health_ib_sysfs_root": "/var/lib/gpu-sim/sysfs/class/infiniband",
    "node_health_edac_sysfs_root": "/var/lib/gpu-sim/sysfs/devices/system/edac/mc",
    # and its NVMe drives (a tree like /sys/class/nvme, SMART logs in nvme-cli's JSON; gpu-sim-nvme, a shell
    # stand-in for `nvme smart-log`, prints the log gpu-sim keeps per drive: ten Python stand-ins a health run
    # were most of its CPU on this 2-core machine)
    "node_health_nvme_sysfs_root": "/var/lib/gpu-sim/sysfs/class/nvme",
    "node_health_nvme_smart_command": ["gpu-sim-nvme", "smart-log", "{device}", "--output-format=json"],
    "node_health_xid_command": ["gpu-sim", "kernel-log", "--since", "{window}"],
    "corectl_heal_kernel_log": ["gpu-sim", "kernel-log"],  # what heal keeps before a reboot
    # nccl-tests' all_reduce_perf (burn-in, validation): the stand-in answering for the simulated GPUs (gpu-sim's
    # package)
    "node_health_nccl_command": ["/usr/bin/gpu-sim-all-reduce-perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"],
    "node_health_nccl_pair_command": [
        *("srun", "--ntasks-per-node=1", "--gres=gpu:{gpus}", "/usr/bin/gpu-sim-all-reduce-perf"),
        *("-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"),
    ],
    # perftest's ib_write_bw (validation's pairwise round): the stand-in answering for gpu-sim's ports
    "node_health_ib_pair_command": ["/usr/bin/gpu-sim-ib-write-bw", "--report_gbits", "-F"],
    "corectl_burn_in_wait_s": 120,
    "corectl_burn_in_time_min": 5,
    # no InfiniBand devices in a container (no /sys/class/infiniband): enroot's 99-mellanox.sh
    # hook, which mounts over that directory, would fail every container start
    "enroot_mellanox": False,
    # nor modules to load: `gpu-sim modprobe` plays modprobe for GPUDirect RDMA (nvidia-peermem),
    # and gpu-sim's list of loaded modules stands in for /proc/modules
    "rdma_modprobe_command": ["gpu-sim", "modprobe"],
    "rdma_modules_file": "/var/lib/gpu-sim/modules",
    "node_health_modules_file": "/var/lib/gpu-sim/modules",
    # a container shares the host's kernel, so its boot_id never changes: heal's reboot step
    # compares when systemd (PID 1) started instead
    "corectl_heal_boot_time_command": "systemctl show --property=UserspaceTimestampMonotonic --value",
}


def _dump(data: object, header: str) -> str:
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


def write_inventory(spec: LabSpec, repo_vars: dict | None = None, user_key: str | None = None) -> None:
    site = spec.site
    (site.directory / "group_vars").mkdir(parents=True, exist_ok=True)
    (site.directory / "host_vars").mkdir(parents=True, exist_ok=True)
    header = "# Written by `corectl lab up`; `corectl lab up` rewrites it. See docs/testing.md.\n"
    write_if_changed(site.cluster_file, _dump(lab_cluster(spec, user_key), header))
    write_if_changed(site.directory / "group_vars" / "all.yml", _dump({**LAB_GROUP_VARS, **(repo_vars or {})}, header))
    head = spec.nodes()[0]
    write_if_changed(
        site.directory / "host_vars" / f"{head.name}.yml",
        _dump({"base_chrony_allow": [spec.subnet], "base_chrony_local_stratum": 8}, header),
    )


def ensure_key(site: Site, name: str = "id_ed25519") -> Path:
    """A key pair in the lab's .lab/ (corectl's own by default), made once."""
    key = site.lab_dir / name
    if not key.is_file():
        site.lab_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"corectl-lab-{site.name}-{name}", "-f", str(key)],
            check=True,
        )
    return key


def container_state(name: str) -> str | None:
    out = docker("ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.State}}").strip()
    return out or None


def _ensure_network(spec: LabSpec) -> None:
    existing = docker("network", "ls", "--filter", f"name=^{spec.network}$", "--format", "{{.Name}}").strip()
    if existing:
        subnet = docker(
            "network", "inspect", spec.network, "--format", "{{range .IPAM.Config}}{{.Subnet}}{{end}}"
        ).strip()
        if subnet != spec.subnet:
            raise CorectlError(
                f"docker network {spec.network} exists with subnet {subnet}, not {spec.subnet}; run corectl lab down"
            )
        return
    docker("network", "create", "--subnet", spec.subnet, "--label", f"{LABEL}={spec.site.name}", spec.network)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_container(spec: LabSpec, hostname: str, address: str, image: str, ssh_port: int | None = None) -> None:
    """Start (or restart) one of the lab's systemd containers; publish its sshd when asked."""
    name = spec.container(hostname)
    state = container_state(name)
    if state == "running":
        return
    if state is not None:
        docker("update", RESTART_POLICY, name)  # containers made before the policy was set
        docker("start", name)
        return
    publish = []
    # Docker writes /etc/hosts anew at every container start, which would lose the cluster's
    # hosts (role base) on each reboot or power cycle: the lab keeps the file on the host instead,
    # like a disk that keeps its files.
    hosts = spec.site.lab_dir / "etc-hosts" / hostname
    if not hosts.is_file():
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{address}\t{hostname}\n")
    if ssh_port is not None:
        if not _port_free(ssh_port):
            raise CorectlError(f"127.0.0.1:{ssh_port} is taken; choose another --ssh-port-base")
        publish = [f"--publish=127.0.0.1:{ssh_port}:22"]
    docker(
        "run",
        "--detach",
        f"--name={name}",
        f"--hostname={hostname}",
        f"--network={spec.network}",
        f"--ip={address}",
        *publish,
        f"--label={LABEL}={spec.site.name}",
        f"--label=corectl.node={hostname}",
        *accounting_flags(),
        *NODE_FLAGS,
        f"--volume={hosts}:/etc/hosts",
        RESTART_POLICY,
        image,
        "/sbin/init",
    )


def wait_booted(container: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = docker("exec", container, "systemctl", "is-system-running", check=False).strip()
        booted = state in ("running", "degraded")
        if booted and _exec_ok(container, "systemctl", "is-active", "--quiet", "ssh"):
            return
        time.sleep(1)
    raise CorectlError(f"{container} did not finish booting in {timeout:.0f}s (systemd state: {state or 'unknown'})")


def _exec_ok(container: str, *argv: str) -> bool:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, check=False).returncode == 0


def _ensure_gpu_devices(container: str, count: int = 8) -> None:
    """Stand-in GPUs: device nodes with NVIDIA's major number (195), as the driver creates them.

    Nothing answers behind them (opening one fails with ENXIO), but Slurm's GRES and device
    cgroup handling see real device files. /dev is rebuilt when a container starts, so every
    `lab up` makes sure they exist.
    """
    script = f"for i in $(seq 0 {count - 1}); do [ -e /dev/nvidia$i ] || mknod -m 0666 /dev/nvidia$i c 195 $i; done"
    docker("exec", container, "sh", "-c", script)


def _authorize(container: str, public_key: str) -> None:
    docker("exec", container, "install", "-d", "-m", "0700", "/root/.ssh")
    docker(
        "exec",
        "-i",
        container,
        "sh",
        "-c",
        "cat > /root/.ssh/authorized_keys && chmod 0600 /root/.ssh/authorized_keys",
        input_bytes=public_key.encode(),
    )


def _record_host_keys(spec: LabSpec) -> None:
    """known_hosts entries read out of band (docker exec), so SSH checks host keys from the start."""
    site = spec.site
    lines = []
    hosts = [*spec.nodes(), *spec.runner_hosts()]
    kept_prefixes = {f"[127.0.0.1]:{n.ssh_port} " for n in hosts}
    if site.known_hosts.is_file():
        lines = [
            line
            for line in site.known_hosts.read_text().splitlines()
            if not any(line.startswith(prefix) for prefix in kept_prefixes)
        ]
    for node in hosts:
        key = docker("exec", spec.container(node.name), "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()
        lines.append(f"[127.0.0.1]:{node.ssh_port} {key[0]} {key[1]}")
    atomic_write(site.known_hosts, ("\n".join(lines) + "\n").encode(), 0o600)


def _check_ssh(spec: LabSpec, key: Path) -> None:
    if shutil.which("ssh") is None:
        raise CorectlError("the ssh client is missing on this machine (apt-get install openssh-client)")
    for node in [*spec.nodes(), *spec.runner_hosts()]:
        for _attempt in range(10):
            proc = subprocess.run(
                [
                    "ssh", "-i", str(key), "-p", str(node.ssh_port),
                    "-o", f"UserKnownHostsFile={spec.site.known_hosts}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                    "root@127.0.0.1", "true",
                ],
                capture_output=True,
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                break
            time.sleep(1)
        else:
            detail = proc.stderr.decode(errors="replace").strip().splitlines()
            raise CorectlError(f"ssh to {node.name} (127.0.0.1:{node.ssh_port}) failed: {detail[-1] if detail else ''}")


def node_image(spec: LabSpec, node: str) -> str:
    """The image a new container of ``node`` starts from (NODE_IMAGE_ENV)."""
    kind = os.environ.get(NODE_IMAGE_ENV, "") or NODE_IMAGES[0]
    if kind not in NODE_IMAGES:
        raise CorectlError(f"{NODE_IMAGE_ENV}={kind}: one of {', '.join(NODE_IMAGES)}", exit_code=2)
    release = spec.release_of(node)
    return ensure_baked_image(spec.site.root, release) if kind == "baked" else ensure_image(release=release)


def up(spec: LabSpec) -> list[LabNode]:
    ensure_engine()
    _refuse_foreign_leftovers(spec.site)
    ensure_image(release=spec.release)
    key = ensure_key(spec.site)
    spec.site.directory.mkdir(parents=True, exist_ok=True)
    save_spec(spec)  # before any container: containers of this site without it were left by another lab
    _ensure_network(spec)
    repo_vars = repo.lab_vars(spec.container(f"{spec.prefix}repo"), spec.network, spec.repo_address(), spec.site.name)
    nodes = spec.nodes()
    _start_nodes(spec, nodes, key)
    user_key = ensure_key(spec.site, f"{LAB_USER}_ed25519").with_suffix(".pub").read_text().strip()
    write_inventory(spec, repo_vars, user_key)
    _start_bmcs(spec, nodes)
    return nodes


def _refuse_foreign_leftovers(site: Site) -> None:
    """A new lab directory whose site name is on containers already: an earlier lab's, left behind
    (its directory deleted, or its run killed). Adopting them would mix its state (Ceph, munge,
    host keys) with this lab's secrets."""
    if (site.lab_dir / SPEC_FILE).is_file():
        return
    names = lab_containers(site)
    if names:
        raise CorectlError(
            f"containers of an earlier lab named {site.name} exist ({', '.join(sorted(names))}), not made for "
            f"{site.directory}; remove them with: corectl lab down --inventory {site.directory}"
        )


def _start_bmcs(spec: LabSpec, nodes: list[LabNode]) -> None:
    """A stand-in BMC per DGX container, and its credentials in the site's vault."""
    for index, node in enumerate(spec.nodes()):
        if not node.head and node in nodes:
            bmc.start(spec.site, node.name, node.address, index, spec.container(node.name))
    try:
        stored = site_secrets.bmc_credentials(spec.site)
    except CorectlError:
        stored = None
    if stored != (bmc.USER, bmc.password(spec.site)):
        site_secrets.set_bmc_credentials(spec.site, bmc.USER, bmc.password(spec.site))


def _start_nodes(spec: LabSpec, nodes: list[LabNode], key: Path) -> None:
    public_key = key.with_suffix(".pub").read_text()
    runners = spec.runner_hosts()
    for node in [*nodes, *runners]:
        start_container(spec, node.name, node.address, node_image(spec, node.name), node.ssh_port)
    for node in [*nodes, *runners]:
        container = spec.container(node.name)
        wait_booted(container)
        _authorize(container, public_key)
        if not node.head and node not in runners:
            _ensure_gpu_devices(container)
    _record_host_keys(spec)
    _check_ssh(spec, key)


SPEC_FILE = "spec.json"


def save_spec(spec: LabSpec) -> None:
    keys = ("computes", "subnet", "ssh_port_base", "prefix", "ceph", "runners", "heads", "release", "releases")
    data = {k: getattr(spec, k) for k in keys}
    spec.site.lab_dir.mkdir(parents=True, exist_ok=True)
    (spec.site.lab_dir / SPEC_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load_spec(site: Site) -> LabSpec:
    try:
        data = json.loads((site.lab_dir / SPEC_FILE).read_text())
    except (OSError, ValueError):
        raise CorectlError(f"no lab is up for site {site.name}; run corectl lab up --inventory {site.name}") from None
    return LabSpec(site=site, **data)


BARE_ADMIN = "dgxadmin"


def add(site: Site, bare: bool = False, head: bool = False, release: str | None = None) -> LabNode:
    """Start one more DGX stand-in beside a running lab (not declared anywhere: see corectl add-node).

    ``bare``: like a freshly installed machine: corectl's key is not installed and its host key not
    recorded; an admin user (dgxadmin, sudo) has a random password kept in .lab/<node>.password, for
    `corectl bootstrap`. ``head``: the second head stand-in instead (head02; one at most). ``release``:
    its Debian release when not the lab's (a node of another OS generation).
    """
    ensure_engine()
    spec = load_spec(site)
    if head and spec.heads > 1:
        raise CorectlError(f"lab {site.name} has its second head already", exit_code=2)
    spec = replace(spec, heads=2) if head else replace(spec, computes=spec.computes + 1)
    node = [n for n in spec.nodes() if n.head == head][-1]
    if release is not None and release != spec.release:
        spec = replace(spec, releases={**spec.releases, node.name: release})
    if bare:
        _start_bare(spec, node)
    else:
        _start_nodes(spec, [node], ensure_key(site))
    _start_bmcs(spec, [node])
    save_spec(spec)
    return node


def _start_bare(spec: LabSpec, node: LabNode) -> None:
    """A stand-in like a freshly installed machine: no corectl key, an admin user with a password in .lab/."""
    container = spec.container(node.name)
    start_container(spec, node.name, node.address, node_image(spec, node.name), node.ssh_port)
    wait_booted(container)
    if not node.head:
        _ensure_gpu_devices(container)
    password = secrets.token_urlsafe(18)
    docker("exec", container, "useradd", "--create-home", "--shell", "/bin/bash", "--groups", "sudo", BARE_ADMIN)
    docker("exec", "-i", container, "chpasswd", input_bytes=f"{BARE_ADMIN}:{password}\n".encode())
    atomic_write(spec.site.lab_dir / f"{node.name}.password", (password + "\n").encode(), 0o600)


def replace_node(site: Site, name: str) -> LabNode:
    """A declared node's machine replaced by a blank one with its name and address (a head whose disk died): the
    old container goes with its disk, the new one is bare (see add), and its old host key is forgotten (what an
    operator does with ssh-keygen -R before bootstrapping the new machine)."""
    ensure_engine()
    spec = load_spec(site)
    node = next((n for n in spec.nodes() if n.name == name), None)
    if node is None:
        raise CorectlError(f"{name} is not a node of lab {site.name} ({', '.join(n.name for n in spec.nodes())})")
    container = spec.container(name)
    if container_state(container) is not None:
        docker("rm", "--force", "--volumes", container)
    (spec.site.lab_dir / "etc-hosts" / name).unlink(missing_ok=True)  # the old disk's /etc/hosts
    _start_bare(spec, node)
    forget_host_key(site, node.ssh_port)
    return node


def forget_host_key(site: Site, port: int) -> None:
    """Drop the site's known_hosts entry for the lab endpoint 127.0.0.1:``port`` (ssh-keygen -R); a site without
    known_hosts has nothing to forget, and gets none."""
    if not site.known_hosts.is_file():
        return
    endpoint = f"[127.0.0.1]:{port} "
    kept = [line for line in site.known_hosts.read_text().splitlines() if not line.startswith(endpoint)]
    atomic_write(site.known_hosts, ("\n".join(kept) + "\n").encode(), 0o600)


def lab_containers(site: Site) -> list[str]:
    """Every container labelled with the site's name, running or not (the nodes, Ceph, the repository)."""
    return docker("ps", "-a", "--filter", f"label={LABEL}={site.name}", "--format", "{{.Names}}").split()


def running_nodes(site: Site) -> list[str]:
    out = docker("ps", "-a", "--filter", f"label={LABEL}={site.name}", "--format", '{{.Label "corectl.node"}}')
    return sorted(line for line in out.split() if line)


def remove_slurm_cgroups(node_names: list[str], cgroup_root: Path = CGROUP_ROOT) -> int:
    """Slurm in a --cgroupns=host container leaves /slurm_<node> trees in the host's cgroups."""
    removed = 0
    for name in node_names:
        for tree in cgroup_root.glob(f"*/slurm_{name}"):
            remove_cgroup_tree(tree)
            removed += 1
    return removed


def remove_cgroup_tree(tree: Path) -> None:
    """A cgroup and every cgroup below it, deepest first (a cgroup's files go with its directory)."""
    for directory in sorted((p for p in tree.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        directory.rmdir()
    tree.rmdir()


def down(site: Site) -> list[str]:
    ensure_engine()
    names = running_nodes(site)
    containers = lab_containers(site)
    bmc.stop_all(site, set(containers))
    if containers:
        docker("rm", "--force", "--volumes", *containers)
    networks = docker("network", "ls", "-q", "--filter", f"label={LABEL}={site.name}").split()
    if networks:
        docker("network", "rm", *networks)
    remove_slurm_cgroups(names)
    # the fact cache and the run records describe machines that are gone: the next lab up is a new cluster, whose
    # first provision must start slurmctld on its empty state (role slurm holds it on a site that has run before)
    for kept in (site.facts_dir, site.runs_dir):
        if kept.is_dir():
            shutil.rmtree(kept)
    return names

"""The cluster description (cluster.yml) as typed models.

Only shape and per-field rules live here; rules that span sections (references, uniqueness,
topology) live in ``checks.py`` so each error can name the exact field that is wrong.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from corectl.site.fields import (
    AbsPath,
    EnvName,
    FreeText,
    HostAddress,
    HostExpr,
    Identifier,
    JumpHost,
    KexAlgorithm,
    KeyPath,
    Label,
    Port,
    PosixUser,
    SshPublicKey,
    Strict,
    TimeZone,
)
from corectl.site.model_services import (
    Backup,
    Cephfs,
    Control,
    Health,
    Logs,
    Monitoring,
    NodeLocal,
)
from corectl.site.model_slurm import Slurm

Role = Literal["slurm_controller", "slurm_dbd", "login", "compute", "monitoring"]
ROLES: tuple[str, ...] = ("slurm_controller", "slurm_dbd", "login", "compute", "monitoring")


class SshAccess(Strict):
    """How corectl reaches nodes by default."""

    user: PosixUser = Field("root", description="SSH login user on the nodes")
    key: KeyPath | None = Field(
        None, description="private key file; relative paths are relative to the inventory directory"
    )
    port: Port = Field(22, description="SSH port on the nodes")
    jump_host: JumpHost | None = Field(None, description="optional ProxyJump, e.g. admin@bastion:22")
    kex_algorithms: list[KexAlgorithm] = Field(
        default_factory=list,
        max_length=12,
        description="key exchange of corectl's SSH to the nodes (OpenSSH KexAlgorithms), preferred first; "
        "default: OpenSSH's own",
    )

    def client_options(self, jump_host: str | None) -> list[str]:
        """ssh's options for a connection to a node (Ansible's, a node-local job's): the key exchange, the jump."""
        options = ["-o", f"KexAlgorithms={','.join(self.kex_algorithms)}"] if self.kex_algorithms else []
        return options + (["-o", f"ProxyJump={jump_host}"] if jump_host else [])


class NodeSsh(Strict):
    """Per-node override of how corectl reaches the node (not how nodes reach each other)."""

    host: HostAddress | None = Field(None, description="address corectl connects to (default: the node's address)")
    port: Port | None = None
    user: PosixUser | None = None
    jump_host: JumpHost | None = None


class ClusterSettings(Strict):
    name: Identifier = Field(description="cluster name (Slurm ClusterName)")
    domain: Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$", max_length=253)]
    timezone: TimeZone = "Etc/UTC"
    ntp_servers: list[HostAddress] = Field(min_length=1, description="NTP servers every node syncs from")
    ssh: SshAccess = Field(default_factory=SshAccess)
    environment: dict[EnvName, str] = Field(
        default_factory=dict, description="variables set for every login session (/etc/environment)"
    )


class GpuSpec(Strict):
    count: Annotated[int, Field(ge=1, le=64)]
    model: Identifier = Field(description="GRES type, e.g. h100")
    nvswitch: bool = False
    autodetect: Literal["off", "nvml"] = Field("off", description="gres.conf AutoDetect")
    sockets: list[Annotated[int, Field(ge=0, le=63)]] | None = Field(
        None,
        description="CPU socket of each GPU, by GPU index (gres.conf Cores=); default: the GPUs split evenly "
        "over the sockets in index order, as on DGX H100 (GPUs 0-3 on socket 0, 4-7 on socket 1)",
    )


class Profile(Strict):
    """A hardware profile shared by many nodes (numbers as `slurmd -C` reports them)."""

    description: FreeText = ""
    sockets: Annotated[int, Field(ge=1, le=64)]
    cores_per_socket: Annotated[int, Field(ge=1, le=4096)]
    threads_per_core: Annotated[int, Field(ge=1, le=8)] = 1
    memory_mb: Annotated[int, Field(ge=256, le=2**40, description="Slurm RealMemory in MiB")]
    gpus: GpuSpec | None = None
    scratch: AbsPath | None = Field(None, description="local scratch directory, e.g. /raid")
    nvme_drives: Annotated[int, Field(ge=0, le=64)] = Field(
        0, description="NVMe drives health checks find live (DGX H100: 2 boot + 8 data = 10); 0 = not checked"
    )
    gpudirect_rdma: bool = Field(
        False, description="load nvidia-peermem at boot (GPUDirect RDMA) on this profile's nodes of an RDMA fabric"
    )


BmcProtocol = Literal["redfish", "ipmi"]
BMC_DEFAULT_PORTS = {("redfish", "https"): 443, ("redfish", "http"): 80, ("ipmi", "https"): 623, ("ipmi", "http"): 623}


class Bmc(Strict):
    """The node's baseboard management controller: out-of-band power (corectl power, corectl heal).

    Its user name and password are the site's, stored in the vault (corectl secrets set-bmc).
    """

    # checked by hostlist.expand_addresses, like the node address
    address: Annotated[str, StringConstraints(max_length=255)] = Field(
        description="BMC IPv4 address, or first address of a range (10.0.9.11 or 10.0.9.[11-22])"
    )
    protocol: BmcProtocol = Field("redfish", description="redfish (DGX H100's BMC) or ipmi (IPMI over LAN)")
    port: Port | None = Field(None, description="default: 443 for Redfish over HTTPS, 623 for IPMI")
    scheme: Literal["https", "http"] = Field("https", description="Redfish only; http only for test stand-ins")
    ca_file: KeyPath | None = Field(
        None,
        description="Redfish: CA bundle to verify the BMC's certificate (default: not verified, as BMCs "
        "ship self-signed certificates); relative to the inventory directory",
    )


class NodeEntry(Strict):
    """One node, or a range of nodes such as ``dgx[01-12]`` with a start address."""

    name: HostExpr
    # checked by hostlist.expand_addresses (IPv4 only), which knows how many nodes the entry has
    address: Annotated[str, StringConstraints(max_length=255)] = Field(
        description="cluster IPv4 address, or first address of a range (10.0.1.11 or 10.0.1.[11-22])"
    )
    profile: Identifier
    roles: list[Role] = Field(min_length=1)
    rack: Label | None = None
    leaf: Label | None = Field(None, description="leaf switch of the compute fabric")
    ssh: NodeSsh | None = None
    bmc: Bmc | None = None


class Switch(Strict):
    name: Identifier
    switches: list[Identifier] = Field(
        default_factory=list, description="switches below this one (empty for a leaf switch)"
    )


NcclValue = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.,:=/+@^-]*$", max_length=1024)]


class Fabric(Strict):
    kind: Literal["infiniband", "roce", "ethernet"] = Field(
        "infiniband", description="infiniband and roce are RDMA fabrics: their nodes get RDMA user space"
    )
    rate_gbps: Annotated[int, Field(ge=1, le=100_000)] = 400
    switches: list[Switch] = Field(min_length=1)
    hcas: list[Identifier] = Field(
        default_factory=list, description="RDMA devices NCCL uses (NCCL_IB_HCA), e.g. mlx5_0 ... mlx5_7"
    )
    socket_interface: Label | None = Field(
        None, description="network interface for NCCL's bootstrap and socket traffic (NCCL_SOCKET_IFNAME)"
    )
    nccl: dict[EnvName, NcclValue] = Field(
        default_factory=dict, description="more NCCL settings for every job, bare and in containers"
    )


class Group(Strict):
    name: Identifier
    gid: Annotated[int, Field(ge=1000, le=60000)]


class User(Strict):
    name: Identifier
    uid: Annotated[int, Field(ge=1000, le=60000)]
    group: Identifier = Field(description="primary group")
    groups: list[Identifier] = Field(default_factory=list, description="supplementary groups")
    ssh_keys: list[SshPublicKey] = Field(default_factory=list, description="OpenSSH public keys, one per item")
    admin: bool = False
    shell: AbsPath = "/bin/bash"
    state: Literal["present", "absent"] = "present"
    slurm_accounts: list[Identifier] = Field(
        default_factory=list, description="Slurm accounts, the first is the default (default: group, then groups)"
    )


class ClusterConfig(Strict):
    """The whole of inventories/<site>/cluster.yml."""

    cluster: ClusterSettings
    profiles: dict[Identifier, Profile] = Field(min_length=1)
    nodes: list[NodeEntry] = Field(min_length=1)
    fabric: Fabric | None = None
    slurm: Slurm
    groups: list[Group] = Field(default_factory=list)
    users: list[User] = Field(default_factory=list)
    cephfs: Cephfs | None = None
    monitoring: Monitoring = Field(default_factory=Monitoring)
    health: Health = Field(default_factory=Health)
    control: Control | None = None
    node_local: NodeLocal = Field(default_factory=NodeLocal)
    backup: Backup | None = None
    logs: Logs | None = None


class NodeBmc(BaseModel):
    """One node's BMC endpoint after range expansion."""

    model_config = ConfigDict(frozen=True)

    address: str
    protocol: BmcProtocol
    port: int
    scheme: str
    ca_file: str | None


class Node(BaseModel):
    """One concrete node after range expansion; ``source`` is its entry's index in ``nodes``."""

    model_config = ConfigDict(frozen=True)

    name: str
    address: str
    profile: str
    roles: tuple[str, ...]
    rack: str | None
    leaf: str | None
    ssh_host: str
    ssh_port: int
    ssh_user: str
    jump_host: str | None
    source: int
    bmc: NodeBmc | None = None


class Cluster(BaseModel):
    """A validated cluster: the declaration plus its expanded, name-sorted nodes."""

    model_config = ConfigDict(frozen=True)

    config: ClusterConfig
    nodes: tuple[Node, ...]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def with_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if role in n.roles]

    def with_gpus(self) -> list[Node]:
        """Nodes whose profile declares GPUs (the inventory group ``gpu``)."""
        return [n for n in self.nodes if self.config.profiles[n.profile].gpus is not None]

"""The cluster description (cluster.yml) as typed models.

Only shape and per-field rules live here; rules that span sections (references, uniqueness,
topology) live in ``checks.py`` so each error can name the exact field that is wrong.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from corectl.site.fields import (
    AbsPath,
    EnvName,
    FreeText,
    HostAddress,
    HostExpr,
    Identifier,
    JumpHost,
    KeyPath,
    Label,
    MonitorAddress,
    MountOption,
    Port,
    PosixUser,
    SshPublicKey,
    TimeZone,
)

# Slurm accounting: TRES names are checked in checks.py (one "unknown TRES" message); counts
# are plain numbers (mem in MiB); times are Slurm's [days-]hours[:minutes[:seconds]] or minutes
TresName = Annotated[str, StringConstraints(pattern=r"^[a-z]+(/[a-z0-9_-]+)?$", max_length=63)]
TresCount = Annotated[int, Field(ge=0, le=2**53)]
BillingWeight = Annotated[float, Field(ge=0, le=1_000_000)]
PriorityWeight = Annotated[int, Field(ge=0, le=2**32 - 1)]
WallTime = Annotated[str, StringConstraints(pattern=r"^(\d{1,5}-)?\d{1,6}(:\d{2}){0,2}$")]
# sacctmgr keeps a description lowercased, quotes turned into backquotes: plain words only
SlurmText = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9 .,:;/()+@#_-]*$", max_length=200)]

Role = Literal["slurm_controller", "slurm_dbd", "login", "compute", "monitoring"]
ROLES: tuple[str, ...] = ("slurm_controller", "slurm_dbd", "login", "compute", "monitoring")


class Strict(BaseModel):
    """Every section rejects unknown keys: a typo must never pass silently."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)


class SshAccess(Strict):
    """How corectl reaches nodes by default."""

    user: PosixUser = Field("root", description="SSH login user on the nodes")
    key: KeyPath | None = Field(
        None, description="private key file; relative paths are relative to the inventory directory"
    )
    port: Port = Field(22, description="SSH port on the nodes")
    jump_host: JumpHost | None = Field(None, description="optional ProxyJump, e.g. admin@bastion:22")


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


class Partition(Strict):
    name: Identifier
    nodes: HostExpr
    default: bool = False
    max_time: Annotated[str, StringConstraints(pattern=r"^(INFINITE|UNLIMITED|(\d+-)?\d+(:\d{2}){0,2})$")] = "INFINITE"
    max_nodes: Annotated[int, Field(ge=1, le=100_000)] | None = None
    allow_groups: list[Identifier] = Field(default_factory=list)
    billing_weights: dict[TresName, BillingWeight] | None = Field(
        None,
        description="TRESBillingWeights: weight per cpu, mem (per GiB), node, gres/gpu; default for a partition "
        "with GPU nodes: cpu 1, and memory and GPUs weighted so that all of a node's memory, or all its GPUs, "
        "weigh as much as all its CPUs; {} bills CPUs only (Slurm's default)",
    )


class Priority(Strict):
    """slurm.conf's multifactor priority (PriorityType=priority/multifactor, with accounting)."""

    fairshare: PriorityWeight = Field(10000, description="PriorityWeightFairshare")
    age: PriorityWeight = Field(1000, description="PriorityWeightAge")
    job_size: PriorityWeight = Field(0, description="PriorityWeightJobSize")
    partition: PriorityWeight = Field(0, description="PriorityWeightPartition")
    qos: PriorityWeight = Field(5000, description="PriorityWeightQOS")
    decay_half_life: WallTime = Field("7-0", description="PriorityDecayHalfLife of past usage (days-hours)")
    max_age: WallTime = Field("7-0", description="PriorityMaxAge: waiting longer adds no more age priority")


class Qos(Strict):
    """A Slurm QOS (sacctmgr add qos): priority, preemption and limits."""

    name: Identifier
    description: SlurmText = ""
    priority: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    preempt: list[Identifier] = Field(default_factory=list, description="QOS whose jobs this QOS may preempt")
    preempt_mode: Literal["requeue", "cancel"] | None = Field(
        None, description="how its jobs are preempted (default: the cluster's PreemptMode, REQUEUE)"
    )
    grp_tres: dict[TresName, TresCount] = Field(default_factory=dict, description="GrpTRES: all its jobs together")
    max_tres_per_user: dict[TresName, TresCount] = Field(default_factory=dict, description="MaxTRESPerUser")
    max_wall: WallTime | None = Field(None, description="MaxWall per job")


class Account(Strict):
    """A Slurm account (an association on this cluster) under root or another account."""

    name: Identifier
    parent: Identifier = "root"
    # a share of 0 leaves the account's fairshare factor at nothing (Slurm divides by shares)
    fairshare: int = Field(1, le=2**31 - 1, description="Fairshare: shares relative to its siblings (at least 1)")
    description: SlurmText = ""
    qos: list[Identifier] = Field(default_factory=list, description="QOS its jobs may use (default: its parent's)")
    default_qos: Identifier | None = None
    grp_tres: dict[TresName, TresCount] = Field(default_factory=dict, description="GrpTRES: the account's cap")
    max_tres_per_user: dict[TresName, TresCount] = Field(
        default_factory=dict, description="per user in this account and its sub-accounts (each user's GrpTRES)"
    )
    max_wall: WallTime | None = Field(None, description="MaxWall per job")


DEFAULT_STATE_DIR = "/var/lib/slurm/slurmctld"


class Slurm(Strict):
    accounting: bool = True
    pam_slurm_adopt: bool = True
    backup_controller: Identifier | None = Field(
        None,
        description="a declared node running a second slurmctld that takes over when the controller stops answering"
        " (needs state_dir on a cephfs mount both see)",
    )
    state_dir: AbsPath | None = Field(
        None,
        description=f"slurmctld's StateSaveLocation (default {DEFAULT_STATE_DIR}); with a backup_controller, a path"
        " under a cephfs mountpoint",
    )
    controller_timeout_s: Annotated[int, Field(ge=5, le=3600)] = Field(
        120, description="SlurmctldTimeout: how long the backup waits for an unanswering controller before taking over"
    )
    partitions: list[Partition] = Field(min_length=1)
    priority: Priority = Field(default_factory=Priority)
    qos: list[Qos] = Field(default_factory=list)
    accounts: list[Account] = Field(
        default_factory=list, description="declared accounts; every group not declared here is an account under root"
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


class CephMount(Strict):
    fs_name: Identifier
    path: AbsPath = "/"
    mountpoint: AbsPath
    client: Identifier = Field(description="cephx client id (without 'client.')")
    fuse: bool = False
    options: list[MountOption] = Field(default_factory=lambda: ["noatime"])


class Cephfs(Strict):
    monitors: list[MonitorAddress] = Field(min_length=1, description="monitor addresses, host:port")
    mounts: list[CephMount] = Field(default_factory=list)


EmailAddress = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$", max_length=254)
]
AlertName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]*$", max_length=100)]
AlertLabel = Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_]*$", max_length=63)]
AlertDuration = Annotated[str, StringConstraints(pattern=r"^\d{1,5}[smhd]$")]
SmtpHost = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9.-]+:\d{1,5}$", max_length=260)]


class AlertReceiver(Strict):
    """Where alerts go: e-mail addresses and/or a webhook (a chat tool's; its URL, which usually holds a token, is
    kept in the vault: corectl secrets set-webhook NAME)."""

    name: Identifier
    email: list[EmailAddress] = Field(default_factory=list)
    webhook: bool = Field(False, description="post to the URL stored with corectl secrets set-webhook <name>")


class AlertRoute(Strict):
    """Alerts of these severities and/or names go to this receiver instead of the default one."""

    receiver: Identifier
    severity: list[Literal["warning", "critical"]] = Field(default_factory=list)
    alerts: list[AlertName] = Field(default_factory=list, description="alert names, e.g. GpuXidError")


class Smtp(Strict):
    smarthost: SmtpHost = Field(description="the mail relay, host:port (no authentication)")
    sender: EmailAddress = Field(description="the From address")
    require_tls: bool = True


class Alerts(Strict):
    """Alertmanager on the monitoring node (issue 29): who gets which alert; one message per group, a node that is
    down does not also page for its GPUs, nodes drained by corectl are silenced until resumed."""

    receiver: Identifier = Field(description="the default receiver")
    receivers: list[AlertReceiver] = Field(min_length=1)
    routes: list[AlertRoute] = Field(default_factory=list)
    smtp: Smtp | None = None
    group_by: list[AlertLabel] = Field(default_factory=lambda: ["alertname", "node"])
    repeat_interval: AlertDuration = "4h"


class Grafana(Strict):
    """Grafana on the monitoring node (issue 29): corectl's dashboards over Prometheus, installed from Grafana's own
    package repository; its admin password lives in the vault."""

    install: bool = Field(
        True,
        description="install and configure Grafana on the monitoring node; false: the site's own Grafana there is "
        "given only corectl's data source and dashboards",
    )
    anonymous_viewers: bool = Field(True, description="anyone who reaches its port sees the dashboards (read only)")


class Monitoring(Strict):
    prometheus: bool = True
    scrape_interval: Annotated[str, StringConstraints(pattern=r"^\d{1,6}[smh]$")] = "30s"
    retention: Annotated[str, StringConstraints(pattern=r"^\d{1,6}[hdwy]$")] = "15d"
    alerts: Alerts | None = None
    grafana: Grafana | None = None


XidNumber = Annotated[int, Field(ge=1, le=999)]
XidClass = Literal["ignore", "application", "hardware"]
# The health checks' limits a site may set here: the checker's settings of the same names (their defaults and
# meaning: roles/node_health/defaults/main.yml, docs/roles.md); each a whole number, 0 or more.
HealthThreshold = Literal[
    "max_temperature",
    "max_memory_temperature",
    "ecc_volatile_uncorrected_max",
    "nvlink_error_max",
    "pcie_replay_max",
    "xid_window_s",
    "edac_ue_max",
    "ib_error_increase_max",
    "ib_link_downed_max",
    "clock_unsynced_grace_s",
]
# of these, the ones 0 would turn off unnoticed (a kernel log window of 0 s reads no Xid at all)
POSITIVE_THRESHOLDS = frozenset({"xid_window_s", "max_temperature", "max_memory_temperature"})


class Validation(Strict):
    """Validation of idle nodes through Slurm: a timer on the controller submits the health checker's dcgm-diag and
    nccl checks as jobs of a QOS every other QOS preempts, to GPU nodes idle long enough; a node that fails is
    drained with the check and its figure in the reason (docs/operations.md)."""

    interval_min: Annotated[int, Field(ge=1, le=10080)] = Field(60, description="how often a round starts (minutes)")
    idle_min: Annotated[int, Field(ge=0, le=525600)] = Field(
        30, description="a GPU node is validated once it has run no job for this long (minutes)"
    )
    max_nodes: Annotated[int, Field(ge=1, le=100000)] = Field(
        2, description="validation jobs at most at once (the GPUs they hold wait for nothing else)"
    )
    dcgm_level: Literal[1, 2, 3] = Field(2, description="dcgmi diag level (2: about two minutes on an H100)")
    time_limit_min: Annotated[int, Field(ge=1, le=1440)] = Field(30, description="each validation job's time limit")
    qos: Identifier = Field("validation", description="the QOS corectl adds for its validation jobs")
    pairwise_interval_min: Annotated[int, Field(ge=1, le=43200)] | None = Field(
        None,
        description="how often a second timer runs the pairwise round (NCCL and ib_write_bw between two idle nodes) "
        "over idle nodes, at most max_nodes of them (minutes; absent: by hand only, corectl validate-nodes --pairwise)",
    )


class Health(Strict):
    """The health checks' site policy (issue 33). NVIDIA's Xid catalog (group_vars/all/xid.yml)
    classes each Xid by its immediate action; a site names other classes here."""

    xid_classes: dict[XidNumber, XidClass] = Field(
        default_factory=dict,
        description="Xid -> ignore (drains nothing), application (reported, not drained) or hardware (drained "
        "and kept until heal or corectl resume), over the class NVIDIA's catalog gives it",
    )
    thresholds: dict[HealthThreshold, Annotated[int, Field(ge=0, le=1_000_000_000)]] = Field(
        default_factory=dict,
        description="the health checks' limits, over the role's defaults (e.g. max_temperature: 83, "
        "ib_error_increase_max: 10, xid_window_s: 3600)",
    )
    validation: Validation | None = Field(None, description="validation of idle GPU nodes (off when absent)")


class RunnerHost(Strict):
    """A runner host: runs shards of a run with `ansible-runner worker` (docs/scale.md)."""

    name: Identifier
    host: HostAddress = Field(description="address corectl connects to over SSH")
    port: Port = 22
    user: PosixUser = Field("root", description="SSH login user on the runner (the site's cluster.ssh.key)")


class Control(Strict):
    """Runs fanned out over runner hosts (issue 15, docs/scale.md); without this section every
    run goes from the control host itself."""

    runners: list[RunnerHost] = Field(min_length=1, max_length=1000)
    shard_by: Literal["leaf", "rack"] = Field("leaf", description="how compute nodes are grouped into shards")
    shard_hosts: int = Field(
        500,
        ge=1,
        le=100_000,
        description="most hosts in one shard: a runner's leaves or racks share a job up to this many, and a "
        "larger leaf or rack is cut into parts of this many",
    )
    node_endpoint: Literal["ssh", "address"] = Field(
        "ssh",
        description="how runners reach nodes: as the control host does (ssh) or at each node's cluster "
        "address and cluster.ssh.port (address)",
    )
    runner_dir: AbsPath = Field("/var/lib/corectl-runner", description="where `corectl runners bootstrap` installs")
    worker_dir: AbsPath = Field("/dev/shm", description="tmpfs directory for each job's private directory")


NODE_LOCAL_MODES = ("off", "on", "auto")


class NodeLocal(Strict):
    """Node-local runs (issue 30, docs/scale.md): each compute node runs its own plays of site.yml
    against itself, its job sent by the control host through ansible-runner's worker."""

    mode: Literal["off", "on", "auto"] = Field(
        "off",
        description="off: every run from the control host (or its runners); on: node-local for the compute "
        "nodes of every site.yml run that includes the controller; auto: on when such a run reaches at least "
        "auto_from compute nodes",
    )
    auto_from: int = Field(64, ge=1, le=1_000_000, description="compute nodes from which auto turns node-local on")
    parallel: int = Field(32, ge=1, le=4096, description="node jobs running at once")
    install_dir: AbsPath = Field(
        "/var/lib/corectl-local", description="where each node keeps its private ansible-core and ansible-runner"
    )
    job_dir: AbsPath = Field("/dev/shm", description="tmpfs directory for each node job's private directory")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        """YAML 1.1 reads a bare off/on as false/true."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value


# systemd's OnCalendar: "daily", "hourly", "*-*-* 02:30:00", "Mon..Fri 03:00" (checked again by systemd-analyze
# nowhere: a value systemd refuses leaves the timer inactive, which `corectl backup --list` shows as no new backup)
CalendarSpec = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9*:.,/~ -]{1,100}$")]


class BackupHost(Strict):
    """A backup host reached over SSH (issue 34): the head sends each backup there with tar and reads them back the
    same way; the host needs sshd, sh, tar, find and coreutils, and the site's backup key in its user's
    authorized_keys (`corectl secrets backup-key`)."""

    host: HostAddress = Field(description="the backup host's name or address, as the head reaches it")
    port: Port = 22
    user: PosixUser = Field("corectl-backup", description="the user the head logs in as there")
    host_key: Annotated[
        str, StringConstraints(pattern=r"^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/]+={0,3}$")
    ] = Field(description="its SSH host key, as `ssh-keyscan` or its ssh_host_*_key.pub prints it (type and key)")


class Backup(Strict):
    """Backups of the head node (issue 34): the accounting database as one transaction and slurmctld's saved state,
    taken on a timer on the database's host; `corectl backup` takes one now with what corectl keeps as well."""

    destination: str = Field(
        description="where backups are written: an absolute path on the head (shared storage, or a mounted disk), "
        "or on the backup host when `ssh` is set"
    )
    ssh: BackupHost | None = Field(None, description="a backup host over SSH to keep the backups on")
    retention: Annotated[int, Field(ge=1, le=10000)] = Field(7, description="backups kept; older ones are removed")
    schedule: CalendarSpec = Field("daily", description="when the timer takes one (systemd OnCalendar)")
    alert_after_h: Annotated[int, Field(ge=1, le=8760)] = Field(
        36, description="HeadBackupTooOld fires when the last good backup is older than this (hours)"
    )
    prometheus: bool = Field(
        False,
        description="Prometheus's data too, through its TSDB snapshot API (its admin API is then on, and its port "
        "reachable only from the monitoring node itself and the firewall's allowed networks); needs Prometheus on "
        "the accounting database's host",
    )

    @field_validator("destination")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\n" in value or "/../" in f"{value}/":
            raise ValueError(f"must be an absolute path without '..' (got {value!r})")
        return value.rstrip("/") or "/"


class Logs(Strict):
    """Logs in one place (issue 29): every node forwards its journal over TCP to the log host, which keeps one file
    per node with rotation; `corectl logs NODE` reads them there, up or down."""

    host: Identifier | None = Field(None, description="the log host (a declared node); default: the Slurm controller")
    keep_days: Annotated[int, Field(ge=1, le=3650)] = Field(30, description="days of each node's logs kept")
    max_mb: Annotated[int, Field(ge=1, le=1000000)] = Field(
        1024, description="a node's file is rotated at this size (MiB) within the day"
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

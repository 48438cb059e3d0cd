"""cluster.yml's service sections (CephFS, monitoring and alerts, health and validation, runner hosts,
node-local runs, backups, logs) as typed models (corectl.site.model holds the whole)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from corectl.site.fields import (
    AbsPath,
    HostAddress,
    Identifier,
    MonitorAddress,
    MountOption,
    Port,
    PosixUser,
    Strict,
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
    "ib_xmit_discards_increase_max",
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
        "auto",
        description="off: every run from the control host (or its runners); on: node-local for the compute "
        "nodes of every site.yml run that includes the controller; auto (default): on when such a run reaches at "
        "least auto_from compute nodes, the site has no runners, and its nodes take the site's key as root",
    )
    auto_from: int = Field(64, ge=1, le=1_000_000, description="compute nodes from which auto turns node-local on")
    parallel: int = Field(32, ge=1, le=4096, description="node jobs running at once")
    processes: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="corectl processes that follow the node jobs' streams, each its share of the nodes (default: "
        "the control host's cores)",
    )
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

"""cluster.yml's slurm section (partitions, priority, QOS, accounts) as typed models (corectl.site.model holds
the whole)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from corectl import hostlist
from corectl.site.fields import (
    AbsPath,
    HostExpr,
    Identifier,
    Strict,
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


class Spares(Strict):
    """A partition's hot spares: provisioned, validated nodes of the partition held out of it by a Slurm reservation
    (corectl_spares_<partition>) until one of its nodes is drained for hardware; then a spare enters the partition
    (the controller's corectl-spares timer, every health-check interval)."""

    nodes: HostExpr | None = Field(None, description="the spares at first: nodes of the partition (or give count)")
    count: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        None, description="this many spares, the partition's last nodes by name at first (or give nodes)"
    )
    repaired: Literal["spare", "back"] = Field(
        "spare",
        description="a repaired node (resumed or healed, validated) becomes a spare (spare), or takes its place back"
        " and the spare that covered it is held again (back)",
    )

    @model_validator(mode="after")
    def one_way(self) -> Spares:
        if (self.nodes is None) == (self.count is None):
            raise ValueError("give either nodes or count")
        return self


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
    spares: Spares | None = Field(None, description="hot spares held out of the partition until a node fails")

    def spare_names(self) -> list[str]:
        """The spares at first: those named, or the partition's last ``count`` nodes by name."""
        if self.spares is None:
            return []
        if self.spares.nodes is not None:
            return hostlist.expand(self.spares.nodes)
        return sorted(hostlist.expand(self.nodes))[-(self.spares.count or 0) :]


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
    requeue_on_hardware_failure: bool = Field(
        True,
        description="requeue the batch jobs running on a node the health program drains for a hardware failure (one the"
        " node keeps until heal or resume), so they restart on other nodes; a job submitted with --no-requeue stays",
    )
    partitions: list[Partition] = Field(min_length=1)
    priority: Priority = Field(default_factory=Priority)
    qos: list[Qos] = Field(default_factory=list)
    accounts: list[Account] = Field(
        default_factory=list, description="declared accounts; every group not declared here is an account under root"
    )

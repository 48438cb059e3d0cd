"""What a period's report shows beside the reliability figures: GPU-hours and jobs per account and
user (Slurm's accounting), and GPU utilisation over time (Prometheus), parsed from what the head
answered.

Definitions (docs/operations.md says them to operators):
- a job counts in the period when Slurm allocated it something (AllocTRES not empty); jobs that
  never started (pending, cancelled before they ran) count nowhere;
- its GPU-hours are its ``gres/gpu`` count in AllocTRES times its elapsed seconds within the period
  (sacct's ``--truncate`` clips a job's start and end to the period) / 3,600;
- utilisation is the mean of DCGM_FI_DEV_GPU_UTIL (%) over every GPU Prometheus has a sample of, and
  GPUs in use the GPUs whose samples carry a job (dcgm-exporter's ``hpc_job`` label), per step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# sacct's fields, in this order (playbooks/report.yml)
SACCT_FIELDS = ("JobID", "User", "Account", "AllocTRES", "ElapsedRaw", "State")
GPU_TRES = "gres/gpu"
POINTS = 200  # about this many points in a period's utilisation series
# The utilisation series, one PromQL expression (the ``series`` label names each): the mean GPU
# utilisation, the GPUs in use by a job and every GPU with a sample.
SERIES = ("util", "busy", "gpus")
UTILISATION_QUERY = " or ".join(
    f'label_replace({expr}, "series", "{name}", "", "")'
    for name, expr in zip(
        SERIES,
        (
            "avg(DCGM_FI_DEV_GPU_UTIL)",
            'count(DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})',
            "count(DCGM_FI_DEV_GPU_UTIL)",
        ),
        strict=True,
    )
)


class UnreadableAnswer(ValueError):
    """The head's answer is not in the expected form (the message says what was wrong)."""


@dataclass(frozen=True)
class Job:
    """One job's allocation in the period."""

    job: str
    user: str
    account: str
    gpus: int
    elapsed_s: int
    state: str

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / 3600


@dataclass(frozen=True)
class Share:
    """An account's or a user's jobs and GPU-hours in the period."""

    name: str
    jobs: int
    gpu_hours: float


@dataclass(frozen=True)
class Usage:
    """Per account and per user, most GPU-hours first."""

    accounts: list[Share]
    users: list[Share]

    @property
    def jobs(self) -> int:
        return sum(s.jobs for s in self.accounts)

    @property
    def gpu_hours(self) -> float:
        return sum(s.gpu_hours for s in self.accounts)


@dataclass(frozen=True)
class Utilisation:
    """The period's series: epoch seconds, mean GPU utilisation (%), GPUs in use, GPUs sampled."""

    times: list[int] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    gpus: list[float] = field(default_factory=list)

    @property
    def mean_util(self) -> float | None:
        return sum(self.util) / len(self.util) if self.util else None

    @property
    def peak_busy(self) -> int:
        return int(max(self.busy, default=0))

    @property
    def most_gpus(self) -> int:
        return int(max(self.gpus, default=0))


@dataclass(frozen=True)
class UsageRead:
    """What the head answered for the period: the usage and the utilisation, or for each (None) one
    line saying why not (corectl.health.usage_read)."""

    usage: Usage | None
    utilisation: Utilisation | None
    usage_note: str = ""
    utilisation_note: str = ""


# --------------------------------------------------------------------------- accounting


def gpu_count(tres: str) -> int:
    """The GPUs of an AllocTRES (``cpu=2,gres/gpu=4,node=1``: 4); typed counts (``gres/gpu:h100=4``)
    repeat the total and are not added again."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key.strip() == GPU_TRES:
            try:
                return int(value)
            except ValueError:
                raise UnreadableAnswer(f"AllocTRES {tres!r}: {GPU_TRES} is not a count") from None
    return 0


def parse_sacct(text: str) -> list[Job]:
    """Jobs from ``sacct -X -n -P --format=<SACCT_FIELDS>``: those with an allocation."""
    jobs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) != len(SACCT_FIELDS):
            raise UnreadableAnswer(f"sacct line {number}: {len(cells)} fields, not {len(SACCT_FIELDS)}: {line!r}")
        job, user, account, tres, elapsed, state = cells
        if not tres.strip():
            continue  # never ran
        try:
            seconds = int(elapsed)
        except ValueError:
            raise UnreadableAnswer(f"sacct line {number}: ElapsedRaw {elapsed!r} is not a number") from None
        jobs.append(Job(job, user or "?", account or "?", gpu_count(tres), seconds, state.split(" ")[0]))
    return jobs


def _shares(jobs: Iterable[Job], key: str) -> list[Share]:
    counts: dict[str, int] = {}
    hours: dict[str, float] = {}
    for job in jobs:
        name = getattr(job, key)
        counts[name] = counts.get(name, 0) + 1
        hours[name] = hours.get(name, 0.0) + job.gpu_hours
    return sorted((Share(n, counts[n], hours[n]) for n in counts), key=lambda s: (-s.gpu_hours, -s.jobs, s.name))


def usage(jobs: list[Job]) -> Usage:
    return Usage(accounts=_shares(jobs, "account"), users=_shares(jobs, "user"))


# --------------------------------------------------------------------------- Prometheus


def step_for(period_s: float, points: int = POINTS) -> int:
    """query_range's step (seconds) that gives about ``points`` points over the period."""
    return max(1, math.ceil(period_s / points))


def parse_query_range(answer: str | dict[str, Any]) -> Utilisation:
    """The series of a query_range answer to UTILISATION_QUERY (its JSON text, or parsed): the times
    are the utilisation's samples; a step without a sample of GPUs in use (no job) counts 0."""
    try:
        data = json.loads(answer) if isinstance(answer, str) else answer
        status, error = data.get("status"), data.get("error", "")
    except (ValueError, AttributeError) as exc:
        raise UnreadableAnswer(f"not a query_range answer: {exc}") from None
    if status != "success":
        raise UnreadableAnswer(f"Prometheus said {status}: {error}".strip())
    by_series: dict[str, dict[int, float]] = {}
    try:
        for result in data["data"]["result"]:
            name = result["metric"].get("series", "")
            by_series[name] = {int(float(t)): float(v) for t, v in result["values"]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UnreadableAnswer(f"not a query_range answer: {exc!r}") from None
    util = by_series.get("util", {})
    times = sorted(util)
    return Utilisation(
        times=times,
        util=[util[t] for t in times],
        busy=[by_series.get("busy", {}).get(t, 0.0) for t in times],
        gpus=[by_series.get("gpus", {}).get(t, 0.0) for t in times],
    )

"""Slurm's drains as the failure history keeps them: which are failures and which planned work, and
how failures are counted (a stretch of failure drains is one failure, a failing health run during
or just before one is its evidence)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from corectl.drain_reason import DrainReason
from corectl.store import parse_stamp

if TYPE_CHECKING:
    from corectl.health.failures import Verdict


@dataclass(frozen=True)
class Drain:
    """A drain or down of a node that Slurm's accounting recorded: when, until when (None: still),
    who set it and why; ``failure``: it was a failure (is_failure), not planned work."""

    node: str
    at: str
    until: str | None
    state: str
    user: str
    reason: str
    failure: bool


# Drains that are failures: every one of corectl's programs' (corectl.drain_reason: Slurm's health
# program's, the GPU handover epilog's, heal's escalation, burn-in's and the validation jobs'), and
# Slurm's own (set by its SlurmUser: a node not responding, a kill that failed). Every other drain (an
# operator's, an upgrade's, add-node's and remove-node's) is planned work and is kept out of failure figures.
SLURM_USER = "slurm("
# A failing health run this long before a failure drain of its node, or during one, is evidence of
# that failure, not another one (Slurm's program drains within its interval of `corectl health`).
SAME_FAILURE_LEAD = timedelta(minutes=10)


def is_failure(reason: str, user: str) -> bool:
    return DrainReason.parse(reason) is not None or user.startswith(SLURM_USER)


@dataclass(frozen=True)
class Stretch:
    """One node's failure drains back to back or overlapping: one failure, whatever its reason became,
    named by its first drain."""

    start: datetime
    end: datetime | None  # None: still drained
    first: Drain

    def covers(self, at: datetime) -> bool:
        """Whether a failing health run at ``at`` is this failure's evidence (during it, or within
        SAME_FAILURE_LEAD before it began)."""
        return self.start - SAME_FAILURE_LEAD <= at and (self.end is None or at <= self.end)


def failure_stretches(drains: Iterable[Drain]) -> list[Stretch]:
    """One node's failure drains as stretches, oldest first."""
    stretches: list[Stretch] = []
    for drain in sorted((d for d in drains if d.failure), key=lambda d: d.at):
        start = parse_stamp(drain.at)
        end = parse_stamp(drain.until) if drain.until else None
        if stretches and (stretches[-1].end is None or start <= stretches[-1].end):
            last = stretches[-1]
            stretches[-1] = Stretch(
                last.start, None if end is None or last.end is None else max(end, last.end), last.first
            )
        else:
            stretches.append(Stretch(start, end, drain))
    return stretches


def failure_count(verdicts: Iterable[Verdict], drains: Iterable[Drain]) -> int:
    """One node's failures: each stretch of failure drains, and each failing health run that is no
    stretch's evidence."""
    stretches = failure_stretches(drains)
    alone = [v for v in verdicts if not v.ok and not any(s.covers(parse_stamp(v.at)) for s in stretches)]
    return len(stretches) + len(alone)

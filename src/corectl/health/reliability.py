"""Reliability figures over a period, from the failure history: per node and per failure class,
failures, mean time between failures, mean time to repair, availability, failures per 1,000
node-days.

Definitions (docs/operations.md says them to operators):
- the period is [since, until]; P is its length;
- a failure is a stretch of failure drains of one node (back to back or overlapping drains are one
  stretch, whatever their reasons became), or a failing health run that is not within one (nor in
  the SAME_FAILURE_LEAD before its start): corectl.health.drains.failure_count's rule;
- a stretch's class is the check its first drain names (``corectl-health: xid: ...`` is ``xid``,
  heal's ``needs hardware service (xid)`` and a validation job's ``corectl validation: nccl: ...`` too;
  burn-in's are ``nccl``, the check it runs), ``gpu-handover`` for the epilog's drains, and
  ``slurm: <reason>`` for Slurm's own; a failing run's class is its first failing check;
- down time is the time a node spent in failure stretches within the period (a stretch still open
  counts up to ``until``); planned drains are up time;
- per node: MTBF = (P - down) / failures, MTTR = down / stretches (a failing run alone has no
  repair time), availability = (P - down) / P;
- per class and for the fleet, over N nodes (the site's compute nodes and any other node with a
  record): MTBF = (N x P - all down time) / failures, MTTR = the class's down time / its stretches,
  failures per 1,000 node-days = 1,000 x failures / (N x P in days).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from corectl.drain_reason import DrainReason, Source
from corectl.health.drains import Drain, Stretch, failure_stretches
from corectl.health.failures import Verdict
from corectl.store import parse_stamp

GPU_HANDOVER = "gpu-handover"  # the class of the epilog's drains (they name no check)


def failure_class(reason: str) -> str:
    """The class of a failure drain, from its reason."""
    found = DrainReason.parse(reason)
    if found is None:
        return f"slurm: {reason.strip() or 'no reason'}"
    return GPU_HANDOVER if found.source == Source.EPILOG else found.check


@dataclass(frozen=True)
class Failure:
    """One failure of one node: when it began, its class, and its repair time in the period
    (None: a failing health run alone, no repair time known)."""

    node: str
    at: datetime
    cls: str
    down: timedelta | None


def clipped(
    stretches: Iterable[Stretch], since: datetime, until: datetime
) -> Iterator[tuple[Stretch, datetime, datetime]]:
    """The stretches that overlap [since, until], each with its start and end within it (a stretch
    still open ends at ``until``)."""
    for stretch in stretches:
        stop = min(stretch.end or until, until)
        if stop >= since and stretch.start <= until:
            yield stretch, max(stretch.start, since), stop


def node_failures(
    node: str, verdicts: Iterable[Verdict], drains: Iterable[Drain], since: datetime, until: datetime
) -> list[Failure]:
    """The node's failures in [since, until], oldest first (see the module's definitions)."""
    stretches = failure_stretches(drains)
    found = []
    for stretch, start, stop in clipped(stretches, since, until):
        found.append(Failure(node, stretch.start, failure_class(stretch.first.reason), stop - start))
    for verdict in verdicts:
        at = parse_stamp(verdict.at)
        if not verdict.ok and since <= at <= until and not any(s.covers(at) for s in stretches):
            found.append(Failure(node, at, verdict.failed[0].name if verdict.failed else "health", None))
    return sorted(found, key=lambda f: f.at)


@dataclass(frozen=True)
class Figures:
    """Failures, down time and the figures of one node, one class or the fleet."""

    name: str
    failures: int
    repaired: int  # failures with a repair time (drain stretches)
    down: timedelta
    mtbf: timedelta | None  # None: no failure
    mttr: timedelta | None  # None: nothing repaired
    availability: float | None  # a class has none
    per_1000_node_days: float


@dataclass
class Reliability:
    since: datetime
    until: datetime
    nodes: list[Figures] = field(default_factory=list)
    classes: list[Figures] = field(default_factory=list)
    fleet: Figures | None = None

    @property
    def node_count(self) -> int:
        return len(self.nodes)


def _figures(name: str, found: list[Failure], up_time: timedelta, node_days: float, span: timedelta | None) -> Figures:
    repaired = [f.down for f in found if f.down is not None]
    down = sum(repaired, timedelta())
    return Figures(
        name=name,
        failures=len(found),
        repaired=len(repaired),
        down=down,
        mtbf=up_time / len(found) if found else None,
        mttr=down / len(repaired) if repaired else None,
        availability=None if span is None else (span - down) / span,
        per_1000_node_days=1000 * len(found) / node_days if node_days else 0.0,
    )


def reliability(
    nodes: Iterable[str],
    evidence: dict[str, tuple[list[Verdict], list[Drain]]],
    since: datetime,
    until: datetime,
) -> Reliability:
    """The figures of the period for ``nodes`` (plus any node ``evidence`` names)."""
    period = until - since
    names = sorted(set(nodes) | set(evidence))
    by_node = {n: node_failures(n, *evidence.get(n, ([], [])), since, until) for n in names}
    one_day = timedelta(days=1)
    result = Reliability(since, until)
    for name in names:
        found = by_node[name]
        down = sum((f.down for f in found if f.down is not None), timedelta())
        result.nodes.append(_figures(name, found, period - down, period / one_day, period))
    everything = [f for found in by_node.values() for f in found]
    fleet_time = period * len(names)
    fleet_up = fleet_time - sum((f.down for f in everything if f.down is not None), timedelta())
    node_days = fleet_time / one_day
    for cls in sorted({f.cls for f in everything}):
        of_class = [f for f in everything if f.cls == cls]
        result.classes.append(_figures(cls, of_class, fleet_up, node_days, None))
    result.classes.sort(key=lambda c: (-c.failures, c.name))
    result.fleet = _figures("all nodes", everything, fleet_up, node_days, fleet_time)
    return result


@dataclass(frozen=True)
class Outage:
    """A node out of service in the period: one failure stretch clipped to the period, its class and
    the reason its first drain gave; ``open``: still drained at the period's end."""

    node: str
    start: datetime
    end: datetime
    open: bool
    cls: str
    reason: str


def outages(evidence: dict[str, tuple[list[Verdict], list[Drain]]], since: datetime, until: datetime) -> list[Outage]:
    """Every node's failure stretches that overlap [since, until], clipped to it, by node then time."""
    found = []
    for node, (_verdicts, drains) in sorted(evidence.items()):
        for stretch, start, stop in clipped(failure_stretches(drains), since, until):
            still = stretch.end is None or stretch.end > until
            reason = stretch.first.reason
            found.append(Outage(node, start, stop, still, failure_class(reason), reason))
    return found


def hours(value: timedelta | None) -> str:
    """A duration as the reports show it: ``6.67 h``, ``-`` for none."""
    return "-" if value is None else f"{value / timedelta(hours=1):.2f} h"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def figure_cells(f: Figures, *, availability: bool) -> list[str]:
    """A node's or a class's row: name, failures, MTBF, MTTR, then availability (a node) or failures
    per 1,000 node-days (a class)."""
    cells = [f.name, str(f.failures), hours(f.mtbf), hours(f.mttr)]
    return [*cells, percent(f.availability) if availability else f"{f.per_1000_node_days:.2f}"]

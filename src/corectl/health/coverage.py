"""How the hot spares covered the period's failures: for each node out of service, when a spare took its place and
when it was back (the time to cover and the time to repair), and the site's capacity over the period (compute
nodes in service against those declared to serve, and the spares in use).

The spares' changes are corectl-spares' own history on the controller (corectl.slurm.SpareEvent, passed here as
plain tuples: health does not import slurm); the nodes out of service are the failure history's outages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from corectl.health.reliability import Outage, hours
from corectl.store import stamp

# corectl.slurm.SpareEvent: at (epoch s), partition, event, node, covered, message
SpareChange = tuple[int, str, str, str, str, str]
# a swap seen this long before its outage began still covers it (the drain's time and the controller's round
# come from two clocks on two hosts)
SLACK = timedelta(minutes=1)


@dataclass(frozen=True)
class Cover:
    """One failure and its spare: ``spare`` and ``covered`` None when no spare took its place in the period."""

    node: str
    failed: datetime
    spare: str | None
    covered: datetime | None
    repaired: datetime | None  # None: still out at the period's end

    @property
    def to_cover(self) -> timedelta | None:
        return None if self.covered is None else max(self.covered - self.failed, timedelta(0))

    @property
    def to_repair(self) -> timedelta | None:
        return None if self.repaired is None else self.repaired - self.failed


@dataclass(frozen=True)
class Capacity:
    """From ``at`` on: compute nodes in service (not out of service, not held as spares) against ``declared`` (the
    compute nodes less the spare pools), and the spares serving for failed nodes."""

    at: datetime
    in_service: int
    declared: int
    spares_in_use: int


def _when(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def covers(outages: Sequence[Outage], changes: Iterable[SpareChange]) -> list[Cover]:
    """Each outage with the first swap for its node during it (or just before its drain was recorded)."""
    swaps = sorted((_when(at), node, covered) for at, _p, event, node, covered, _m in changes if event == "swap")
    found = []
    for outage in outages:
        mine = [(at, spare) for at, spare, covered in swaps if covered == outage.node]
        during = [(at, spare) for at, spare in mine if outage.start - SLACK <= at <= outage.end]
        at, spare = during[0] if during else (None, None)
        found.append(Cover(outage.node, outage.start, spare, at, None if outage.open else outage.end))
    return found


def capacity(
    outages: Sequence[Outage], changes: Iterable[SpareChange], computes: int, pool: int, since: datetime
) -> list[Capacity]:
    """The capacity at the period's start and at every change after it (an outage's start or end, a spare swapped
    in or held again); ``pool``: the spares the site declares."""
    steps: list[tuple[datetime, int, int]] = []  # (when, change of nodes out, change of spares in use)
    for outage in outages:
        steps.append((outage.start, 1, 0))
        if not outage.open:
            steps.append((outage.end, -1, 0))
    for at, _p, event, _node, _covered, _m in changes:
        if event == "swap":
            steps.append((_when(at), 0, 1))
        elif event in ("spare", "back"):
            steps.append((_when(at), 0, -1))
    declared = computes - pool
    out = in_use = 0
    points = [Capacity(since, declared, declared, 0)]
    for at, d_out, d_use in sorted(steps):
        out, in_use = max(out + d_out, 0), min(max(in_use + d_use, 0), pool)
        point = Capacity(max(at, since), declared - out + in_use, declared, in_use)
        if point.at == points[-1].at:
            points[-1] = point
        elif (point.in_service, point.spares_in_use) != (points[-1].in_service, points[-1].spares_in_use):
            points.append(point)
    return points


def short_node_hours(points: Sequence[Capacity], until: datetime) -> float:
    """Node-hours below the declared capacity over the period."""
    total = 0.0
    for point, following in zip(points, [*points[1:], None], strict=True):
        end = following.at if following is not None else until
        total += max(point.declared - point.in_service, 0) * (end - point.at).total_seconds() / 3600
    return total


@dataclass(frozen=True)
class SparesPeriod:
    """The period as the spares saw it: the pool's size, each failure and its spare, the capacity over time."""

    pool: int
    covers: list[Cover]
    capacity: list[Capacity]
    short_node_hours: float

    @property
    def lowest(self) -> Capacity:
        return min(self.capacity, key=lambda c: (c.in_service, c.at))

    @property
    def most_in_use(self) -> int:
        return max(c.spares_in_use for c in self.capacity)

    def as_json(self) -> dict[str, Any]:
        """``{pool, short_node_hours, covers: [{node, failed, spare, covered, cover_s, repaired, repair_s}],
        capacity: [{at, in_service, declared, spares_in_use}]}`` (times as the store writes them)."""

        def at(when: datetime | None) -> str | None:
            return None if when is None else stamp(when)

        def seconds(value: timedelta | None) -> float | None:
            return None if value is None else value.total_seconds()

        return {
            "pool": self.pool,
            "short_node_hours": round(self.short_node_hours, 3),
            "covers": [
                {
                    "node": c.node,
                    "failed": at(c.failed),
                    "spare": c.spare,
                    "covered": at(c.covered),
                    "cover_s": seconds(c.to_cover),
                    "repaired": at(c.repaired),
                    "repair_s": seconds(c.to_repair),
                }
                for c in self.covers
            ],
            "capacity": [
                {"at": at(c.at), "in_service": c.in_service, "declared": c.declared, "spares_in_use": c.spares_in_use}
                for c in self.capacity
            ],
        }


def spares_period(
    outages: Sequence[Outage], changes: Iterable[SpareChange], computes: int, pool: int, since: datetime,
    until: datetime,
) -> SparesPeriod:  # fmt: skip
    changes = list(changes)
    points = capacity(outages, changes, computes, pool, since)
    return SparesPeriod(pool, covers(outages, changes), points, short_node_hours(points, until))


def cover_cells(cover: Cover, shown: Callable[[datetime], str]) -> list[str]:
    """node, failed, spare, covered after, repaired after: the terminal's and the page's rows."""
    return [
        cover.node,
        shown(cover.failed),
        cover.spare or "none",
        hours(cover.to_cover) if cover.to_cover is not None else "-",
        hours(cover.to_repair) if cover.to_repair is not None else "still out",
    ]


def capacity_line(of: SparesPeriod, shown: Callable[[datetime], str]) -> str:
    """``capacity: 11 of 11 declared nodes in service at the end; lowest 10 (2026-12-02 12:12:49Z); spares in use at
    most 1 of 1; 0.05 node-hours short``."""
    end, low = of.capacity[-1], of.lowest
    return (
        f"capacity: {end.in_service} of {end.declared} declared nodes in service at the end; lowest {low.in_service}"
        f" ({shown(low.at)}); spares in use at most {of.most_in_use} of {of.pool}; {of.short_node_hours:.2f}"
        " node-hours short"
    )

"""A site's failure history: every health verdict and remediation action, in the site's store (corectl.store).

The store holds one row per node per health run (``verdicts``), one per remediation action (``actions``) and
one per drain or down Slurm's accounting recorded (``drains``, copied from ``sacctmgr show event`` whenever heal
reads the Slurm state: whoever drained the node, Slurm's health program included). A read (status, history,
rma, report) writes nothing: it adds Slurm's events of now to a copy in memory (``_reading``), so what it shows
is the same, kept or not. Each node's last verdict (`corectl status`) is its newest row in ``verdicts``. Every
failure to open, read or write the store is a StoreUnavailable.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from corectl import store
from corectl.health.drains import Drain, failure_count, is_failure
from corectl.health.stamps import epoch_stamp, window
from corectl.site import Site, groupvars
from corectl.store import StoreUnavailable, stamp
from corectl.words import counted

Report = Mapping[str, Any]  # corectl health's {"node", "ok", "checks": [{"name", "status", "message"}]}


@dataclass(frozen=True)
class FailedCheck:
    name: str
    message: str


@dataclass(frozen=True)
class Verdict:
    """One node's result in one health run."""

    node: str
    at: str
    ok: bool
    failed: tuple[FailedCheck, ...] = ()
    run_id: str | None = None


@dataclass(frozen=True)
class Action:
    """One remediation step taken on a node (drain, GPU reset, reboot, RMA...) and how it ended."""

    node: str
    at: str
    action: str
    outcome: str
    detail: str = ""


Entry = Verdict | Action | Drain


@dataclass(frozen=True)
class Offenders:
    """Nodes with at least ``failures`` failures from ``since`` to ``until`` (both included)."""

    failures: int
    days: int
    since: str
    until: str
    counts: dict[str, int]  # node -> its failures in the window (failure_count), most first


@dataclass(frozen=True)
class RmaCase:
    """A node to send back, with the evidence: its failing verdicts, its failure drains and the
    actions taken, in the window; ``count``: its failures (see failure_count)."""

    node: str
    failures: tuple[Verdict, ...]
    actions: tuple[Action, ...]
    drains: tuple[Drain, ...] = ()
    count: int = 0

    def evidence(self) -> list[Entry]:
        return newest_first([*self.failures, *self.drains, *self.actions])


# --------------------------------------------------------------------------- time


def newest_first(entries: Iterable[Entry]) -> list[Entry]:
    """Newest first; at the same second a drain, then an action come before (after, in time) the
    verdict behind them."""
    return sorted(entries, key=lambda e: (e.at, isinstance(e, Action), isinstance(e, Drain)), reverse=True)


# --------------------------------------------------------------------------- the file


def _reading(site: Site, slurm: Iterable[SlurmEvent] = ()) -> AbstractContextManager[sqlite3.Connection]:
    """The history to read (corectl.store.reading: nothing written), with ``slurm``, the drains and downs Slurm's
    accounting holds now (corectl.slurm.NodeEvent), added in memory."""
    drains = _slurm_drains(slurm)
    return store.reading(site, (lambda conn: _insert_drains(conn, drains)) if drains else None)


# --------------------------------------------------------------------------- writing


def _failed_checks(report: Report) -> list[dict[str, str]]:
    return [
        {"name": str(check.get("name", "")), "message": str(check.get("message", ""))}
        for check in report.get("checks", [])
        if check.get("status") == "fail"
    ]


def record_verdicts(site: Site, reports: Mapping[str, Report], at: datetime, run_id: str | None = None) -> int:
    """One verdict per node of a health run, in one transaction; returns how many were added (a
    node already recorded for ``run_id`` is not counted twice)."""
    when = stamp(at)
    rows = [
        (node, when, 1 if report.get("ok") else 0, json.dumps(_failed_checks(report)), run_id)
        for node, report in reports.items()
    ]
    with store.writing(site) as conn, store.transaction(conn):
        before = conn.total_changes
        conn.executemany(
            "INSERT INTO verdicts (node, at, ok, failed, run_id) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (run_id, node) DO NOTHING",
            rows,
        )
        return conn.total_changes - before


# corectl.slurm.NodeEvent (health does not import slurm): node, start, end (None: still), state, user, reason
SlurmEvent = tuple[str, int, "int | None", str, str, str]


def _slurm_drains(events: Iterable[SlurmEvent]) -> list[Drain]:
    return [
        Drain(node, epoch_stamp(start), None if end is None else epoch_stamp(end), state, user, reason, failure)
        for node, start, end, state, user, reason in events
        for failure in [is_failure(reason, user)]
    ]


def record_slurm_events(site: Site, events: Iterable[SlurmEvent]) -> int:
    """Slurm's drain and down events (corectl.slurm.NodeEvent, epoch seconds), each kept once (a
    later copy updates its end and state); returns how many were new."""
    return record_drains(site, _slurm_drains(events))


def keep_slurm_events(site: Site, events: Iterable[SlurmEvent], warn: Callable[[str], None]) -> None:
    """record_slurm_events for a changing command that read the Slurm state anyway (heal); a history that
    cannot be written: ``warn``."""
    try:
        record_slurm_events(site, events)
    except StoreUnavailable as exc:
        warn(f"warning: Slurm's drains not kept in the history: {exc}")


def _insert_drains(conn: sqlite3.Connection, drains: Iterable[Drain]) -> int:
    """Drains, each kept once (a later copy updates its end and state); returns how many were new."""
    rows = [(d.node, d.at, d.until, d.state, d.user, d.reason, 1 if d.failure else 0) for d in drains]
    if not rows:
        return 0
    known = conn.execute("SELECT COUNT(*) FROM drains").fetchone()[0]
    conn.executemany(
        "INSERT INTO drains (node, at, until, state, user, reason, failure) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (node, at, reason) DO UPDATE SET until = excluded.until, state = excluded.state",
        rows,
    )
    return int(conn.execute("SELECT COUNT(*) FROM drains").fetchone()[0]) - int(known)


def record_drains(site: Site, drains: Iterable[Drain]) -> int:
    """Drains, each kept once (a later copy updates its end and state); returns how many were new."""
    drains = list(drains)
    if not drains:
        return 0
    with store.writing(site) as conn, store.transaction(conn):
        return _insert_drains(conn, drains)


def record_action(site: Site, node: str, action: str, outcome: str, detail: str, at: datetime) -> None:
    """One remediation action on ``node`` (``action``: drain, reset-gpu...; ``outcome``: ok, failed...)."""
    with store.writing(site) as conn, store.transaction(conn):
        conn.execute(
            "INSERT INTO actions (node, at, action, outcome, detail) VALUES (?, ?, ?, ?, ?)",
            (node, stamp(at), action, outcome, detail),
        )


# --------------------------------------------------------------------------- reading

_VERDICT = "SELECT node, at, ok, failed, run_id FROM verdicts"
_ACTION = "SELECT node, at, action, outcome, detail FROM actions"
_DRAIN = "SELECT node, at, until, state, user, reason, failure FROM drains"


def _verdict(row: tuple[Any, ...]) -> Verdict:
    node, at, ok, failed, run_id = row
    checks = tuple(FailedCheck(str(c.get("name", "")), str(c.get("message", ""))) for c in json.loads(failed))
    return Verdict(node=node, at=at, ok=bool(ok), failed=checks, run_id=run_id)


def _action(row: tuple[Any, ...]) -> Action:
    node, at, action, outcome, detail = row
    return Action(node=node, at=at, action=action, outcome=outcome, detail=detail)


def _drain(row: tuple[Any, ...]) -> Drain:
    node, at, until, state, user, reason, failure = row
    return Drain(node=node, at=at, until=until, state=state, user=user, reason=reason, failure=bool(failure))


def node_history(site: Site, node: str, limit: int = 20, slurm: Iterable[SlurmEvent] = ()) -> list[Entry]:
    """The node's newest ``limit`` verdicts, actions and drains together (``slurm``: Slurm's drains now, as
    well as the kept ones), newest first."""
    order = "ORDER BY at DESC, id DESC LIMIT ?"
    with _reading(site, slurm) as conn:
        verdicts = [_verdict(r) for r in conn.execute(f"{_VERDICT} WHERE node = ? {order}", (node, limit))]
        actions = [_action(r) for r in conn.execute(f"{_ACTION} WHERE node = ? {order}", (node, limit))]
        drains = [_drain(r) for r in conn.execute(f"{_DRAIN} WHERE node = ? {order}", (node, limit))]
    return newest_first([*verdicts, *actions, *drains])[:limit]


def last_action(site: Site, node: str, action: str, outcome: str, detail_prefix: str = "") -> Action | None:
    """The node's newest ``action`` that ended with ``outcome`` and whose detail starts with
    ``detail_prefix`` (None: never)."""
    escaped = detail_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    with _reading(site) as conn:
        row = conn.execute(
            f"{_ACTION} WHERE node = ? AND action = ? AND outcome = ? AND detail LIKE ? ESCAPE '\\'"
            " ORDER BY at DESC, id DESC LIMIT 1",
            (node, action, outcome, escaped + "%"),
        ).fetchone()
    return _action(row) if row else None


def _window_evidence(conn: sqlite3.Connection, since: str, until: str) -> dict[str, tuple[list[Verdict], list[Drain]]]:
    """Per node: its failing verdicts from ``since`` to ``until``, and its failure drains that
    overlap that time, newest first."""
    found: dict[str, tuple[list[Verdict], list[Drain]]] = {}
    order = "ORDER BY at DESC, id DESC"
    for row in conn.execute(f"{_VERDICT} WHERE ok = 0 AND at BETWEEN ? AND ? {order}", (since, until)):
        found.setdefault(row[0], ([], []))[0].append(_verdict(row))
    overlap = "failure = 1 AND at <= ? AND (until IS NULL OR until >= ?)"
    for row in conn.execute(f"{_DRAIN} WHERE {overlap} {order}", (until, since)):
        found.setdefault(row[0], ([], []))[1].append(_drain(row))
    return found


def window_evidence(
    site: Site, since: str, until: str, slurm: Iterable[SlurmEvent] = ()
) -> dict[str, tuple[list[Verdict], list[Drain]]]:
    """Per node: its failing verdicts from ``since`` to ``until`` and its failure drains that
    overlap that time (``slurm``: Slurm's drains now, as well as the kept ones), newest first."""
    with _reading(site, slurm) as conn:
        return _window_evidence(conn, since, until)


def _offenders(conn: sqlite3.Connection, failures: int, days: int, now: datetime) -> Offenders:
    since, until = window(days, now)
    evidence = _window_evidence(conn, since, until)
    counts = {node: failure_count(verdicts, drains) for node, (verdicts, drains) in evidence.items()}
    counts = {node: n for node, n in sorted(counts.items(), key=lambda i: (-i[1], i[0])) if n >= failures}
    return Offenders(failures=failures, days=days, since=since, until=until, counts=counts)


def repeat_offenders(
    site: Site, failures: int, days: int, now: datetime, slurm: Iterable[SlurmEvent] = ()
) -> Offenders:
    """Nodes with at least ``failures`` failures in the ``days`` days up to ``now``: failing health
    runs and failure drains (``slurm``: Slurm's drains now, as well as the kept ones), each failure once
    (failure_count)."""
    with _reading(site, slurm) as conn:
        return _offenders(conn, failures, days, now)


def rma_report(
    site: Site, failures: int, days: int, now: datetime, slurm: Iterable[SlurmEvent] = ()
) -> tuple[Offenders, list[RmaCase]]:
    """The repeat offenders, and for each its failing verdicts, failure drains and actions in the window."""
    span = "node = ? AND at BETWEEN ? AND ? ORDER BY at DESC, id DESC"
    cases = []
    with _reading(site, slurm) as conn:
        offenders = _offenders(conn, failures, days, now)
        evidence = _window_evidence(conn, offenders.since, offenders.until)
        for node, count in offenders.counts.items():
            verdicts, drains = evidence[node]
            actions = conn.execute(f"{_ACTION} WHERE {span}", (node, offenders.since, offenders.until))
            cases.append(RmaCase(node, tuple(verdicts), tuple(map(_action, actions)), tuple(drains), count))
    return offenders, cases


def last_verdicts(site: Site) -> dict[str, Verdict]:
    """Each node's newest verdict (the last health run that checked it)."""
    newest = (
        f"{_VERDICT} AS v WHERE id = (SELECT id FROM verdicts WHERE node = v.node ORDER BY at DESC, id DESC LIMIT 1)"
    )
    with _reading(site) as conn:
        return {row[0]: _verdict(row) for row in conn.execute(f"{newest} ORDER BY node")}


# --------------------------------------------------------------------------- the site's rule

FAILURES_VAR = "corectl_repeat_offender_failures"
DAYS_VAR = "corectl_repeat_offender_days"
DEFAULT_FAILURES = 3
DEFAULT_DAYS = 7


def thresholds(site: Site, count: int | None = None, days: int | None = None) -> tuple[int, int]:
    """(failures, days) of the repeat-offender rule: the given ones, else the site's group_vars."""
    if count is not None and days is not None:
        return count, days
    values = groupvars.all_vars(site)
    return (
        count if count is not None else groupvars.whole_number(values, FAILURES_VAR, DEFAULT_FAILURES),
        days if days is not None else groupvars.whole_number(values, DAYS_VAR, DEFAULT_DAYS),
    )


def site_offenders(
    site: Site, now: datetime, warn: Callable[[str], None], slurm: Iterable[SlurmEvent] = ()
) -> Offenders | None:
    """The repeat offenders by the site's rule; a history that cannot be read: ``warn``, and None."""
    count, days = thresholds(site)
    try:
        return repeat_offenders(site, count, days, now, slurm)
    except StoreUnavailable as exc:
        warn(f"warning: repeat offenders not shown: {exc}")
        return None


def rule(count: int, days: int) -> str:
    """``>=3 failures in 7 days``."""
    return f">={counted(count, 'failure')} in {counted(days, 'day')}"

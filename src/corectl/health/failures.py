"""A site's failure history: every health verdict and remediation action, in a local SQLite file.

``inventories/<site>/.history.sqlite`` (Site.history_db) holds one row per node per health run
(``verdicts``), one per remediation action (``actions``) and one per drain or down Slurm's
accounting recorded (``drains``, copied from ``sacctmgr show event`` whenever heal reads the Slurm
state: whoever drained the node, Slurm's health program included). A read (status, history, rma, report)
writes nothing: it reads the file's rows into memory with Slurm's events of now added (``_reading``), so
what it shows is the same, kept or not. Times are UTC, ISO 8601 to the second
(``2026-11-22T09:12:44Z``), so that text order is time order. The file is in WAL mode with a busy
timeout, so that concurrent commands append without losing rows; each write is one transaction.
``PRAGMA user_version`` is the schema version: an older file is migrated when opened, a newer one
is refused. Every failure to open, read or write the file is a HistoryUnavailable.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from corectl.errors import CorectlError
from corectl.health.drains import Drain, failure_count, is_failure
from corectl.health.stamps import epoch_stamp, stamp, window
from corectl.site import Site, groupvars
from corectl.words import counted

BUSY_TIMEOUT_S = 10.0  # how long a writer waits for another one before giving up

# MIGRATIONS[n] takes the schema from version n to n + 1; the schema version is their count.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE verdicts (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            at TEXT NOT NULL,
            ok INTEGER NOT NULL CHECK (ok IN (0, 1)),
            failed TEXT NOT NULL DEFAULT '[]',
            run_id TEXT
        )""",
        # one verdict per node and health run (verdicts without a run id are each their own run)
        "CREATE UNIQUE INDEX verdicts_once_per_run ON verdicts (run_id, node)",
        "CREATE INDEX verdicts_by_node ON verdicts (node, at)",
        "CREATE INDEX verdicts_failed_by_time ON verdicts (at) WHERE ok = 0",
        """CREATE TABLE actions (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            at TEXT NOT NULL,
            action TEXT NOT NULL,
            outcome TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX actions_by_node ON actions (node, at)",
    ),
    (
        """CREATE TABLE drains (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            at TEXT NOT NULL,
            until TEXT,
            state TEXT NOT NULL,
            user TEXT NOT NULL,
            reason TEXT NOT NULL,
            failure INTEGER NOT NULL CHECK (failure IN (0, 1))
        )""",
        "CREATE UNIQUE INDEX drains_once ON drains (node, at, reason)",
        "CREATE INDEX drains_by_node ON drains (node, at)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)

Report = Mapping[str, Any]  # corectl health's {"node", "ok", "checks": [{"name", "status", "message"}]}


class HistoryUnavailable(CorectlError):
    """The history file could not be opened, read or written (one line: the file and why)."""


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


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE (the write lock at once, waiting up to the busy timeout) ... COMMIT or ROLLBACK."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the file to SCHEMA_VERSION (in one transaction); refuse one written by a newer corectl."""
    version = _version(conn)
    if version < SCHEMA_VERSION:
        with _transaction(conn):
            version = _version(conn)  # another process may have migrated it meanwhile
            if version < SCHEMA_VERSION:
                for statements in MIGRATIONS[version:]:
                    for statement in statements:
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                version = SCHEMA_VERSION
    if version > SCHEMA_VERSION:
        raise HistoryUnavailable(
            f"{path}: schema version {version} is newer than this corectl's ({SCHEMA_VERSION}); upgrade corectl"
        )


def _use_wal(conn: sqlite3.Connection) -> None:
    """WAL mode (kept by the file). Switching a new file answers SQLITE_BUSY at once, without the
    busy timeout, while another process opens it too: try again until the timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@contextmanager
def _database(site: Site) -> Iterator[sqlite3.Connection]:
    """The site's history, created or migrated as needed; sqlite and OS errors become HistoryUnavailable."""
    path = site.history_db
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        _use_wal(conn)
        _migrate(conn, str(path))
        yield conn
    except (sqlite3.Error, OSError) as exc:
        raise HistoryUnavailable(f"{path}: {exc}") from None
    finally:
        if conn is not None:
            conn.close()


def _copy_of_file(path: Path, into: sqlite3.Connection) -> None:
    """The file's rows copied into ``into``, without writing beside the file: SQLite's read-only mode creates
    the WAL's -shm and -wal files when no writer has them open and leaves them there, so the file is read
    as immutable when it has no WAL (no writer), and read-only only while a writer holds one (read again
    read-only when a writer started meanwhile)."""
    wal = path.with_name(path.name + "-wal")
    for immutable in (not wal.exists(), False):
        source = sqlite3.connect(f"{path.as_uri()}?{'immutable=1' if immutable else 'mode=ro'}", uri=True)
        try:
            source.backup(into)
        finally:
            source.close()
        if not (immutable and wal.exists()):
            return


@contextmanager
def _reading(site: Site, slurm: Iterable[SlurmEvent] = ()) -> Iterator[sqlite3.Connection]:
    """The history to read, in memory: the file's rows (none when there is no file) at the current schema,
    plus ``slurm``, the drains and downs Slurm's accounting holds now (corectl.slurm.NodeEvent). Reading
    never writes: not the file, not beside it (a read-only command leaves the site as it was)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        if site.history_db.is_file():
            _copy_of_file(site.history_db, conn)
        _migrate(conn, str(site.history_db))
        _insert_drains(conn, _slurm_drains(slurm))
        yield conn
    except (sqlite3.Error, OSError) as exc:
        raise HistoryUnavailable(f"{site.history_db}: {exc}") from None
    finally:
        conn.close()


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
    with _database(site) as conn, _transaction(conn):
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
    except HistoryUnavailable as exc:
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
    with _database(site) as conn, _transaction(conn):
        return _insert_drains(conn, drains)


def record_action(site: Site, node: str, action: str, outcome: str, detail: str, at: datetime) -> None:
    """One remediation action on ``node`` (``action``: drain, reset-gpu...; ``outcome``: ok, failed...)."""
    with _database(site) as conn, _transaction(conn):
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
    except HistoryUnavailable as exc:
        warn(f"warning: repeat offenders not shown: {exc}")
        return None


def rule(count: int, days: int) -> str:
    """``>=3 failures in 7 days``."""
    return f">={counted(count, 'failure')} in {counted(days, 'day')}"

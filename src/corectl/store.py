"""The site's one store (issue 46): ``inventories/<site>/.history.sqlite`` (Site.history_db), one SQLite file
for what corectl keeps about a site between commands: every health verdict, remediation action and Slurm drain
(the failure history: corectl.health.failures), the index of its runs (one row per run, the record
corectl.ansible.records writes; the run's folder under .runs/ keeps its artifacts) and marks (that the site has
run). Times are UTC, ISO 8601 to the second (``2026-11-22T09:12:44Z``), so that text order is time order.

The file is in WAL mode with a busy timeout, so that concurrent commands append without losing rows; each write
is one transaction. ``PRAGMA user_version`` is the schema version: an older file is migrated when a command
writes, a newer one is refused. The migration to version 3 takes in what the stores before it kept: the last
verdicts of ``.health.json``, the records of ``.runs/*/corectl.json`` and the mark ``.runs/site-has-run`` (the
two files are removed once taken in; the run folders stay). Reading never writes, not the file and not beside
it (a read-only command leaves the site as it was): ``reading`` answers from the file as it is, or from a copy
in memory when the file is older or the caller adds rows of its own. Every failure to open, read or write the
file is a StoreUnavailable.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from corectl.errors import CorectlError
from corectl.site import Site

BUSY_TIMEOUT_S = 10.0  # how long a writer waits for another one before giving up
HAS_RUN = "site-has-run"  # the mark of a site whose site.yml once converged (a replaced head then waits)
# the mark of a site whose site.yml once converged on its accounting database's host (a replaced head's
# slurmdbd then waits for a restore rather than start the records from nothing)
ACCOUNTING_HAS_RUN = "accounting-has-run"
OLD_HEALTH = ".health.json"  # before the one store: each node's last verdict
OLD_MARK = Path(".runs") / HAS_RUN  # before the one store: the has-run mark, a file

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
    (
        # one row per run: its id (the folder's name under .runs/), when it started, and the whole record
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            started TEXT NOT NULL,
            record TEXT NOT NULL
        )""",
        "CREATE INDEX runs_by_time ON runs (started, id)",
        "CREATE TABLE marks (name TEXT PRIMARY KEY, at TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '')",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
RUNS_VERSION = 3  # the version that brought runs and marks: the older files are taken in by its migration


class StoreUnavailable(CorectlError):
    """The store could not be opened, read or written (one line: the file and why)."""


def stamp(at: datetime) -> str:
    """``2026-11-22T09:12:44Z``: UTC to the second (a naive time is taken as UTC)."""
    utc = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(at: str) -> datetime:
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def stamp_of(text: str) -> str:
    """Any ISO 8601 time (``2026-11-27T05:00:03+00:00``, ``2026-11-22 09:12:44Z``) as the store writes it; text
    that is no time is kept as it is."""
    try:
        return stamp(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return text


# --------------------------------------------------------------------------- the file


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
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


def _migrate(conn: sqlite3.Connection, site: Site) -> bool:
    """Bring the file to SCHEMA_VERSION (in one transaction); refuse one written by a newer corectl. Whether the
    older stores were taken in (their files can go once this is committed)."""
    version, took_in = _version(conn), False
    if version < SCHEMA_VERSION:
        with transaction(conn):
            version = _version(conn)  # another process may have migrated it meanwhile
            if version < SCHEMA_VERSION:
                for statements in MIGRATIONS[version:]:
                    for statement in statements:
                        conn.execute(statement)
                if version < RUNS_VERSION:
                    _take_in(conn, site)
                    took_in = True
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                version = SCHEMA_VERSION
    if version > SCHEMA_VERSION:
        raise StoreUnavailable(
            f"{site.history_db}: schema version {version} is newer than this corectl's ({SCHEMA_VERSION});"
            " upgrade corectl"
        )
    return took_in


def _take_in(conn: sqlite3.Connection, site: Site) -> None:
    """What the stores before this one kept: each node's last verdict (unless the history has one as new), every
    run record, the has-run mark."""
    try:
        verdicts = json.loads((site.directory / OLD_HEALTH).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        verdicts = {}
    for node, verdict in sorted(verdicts.items()) if isinstance(verdicts, dict) else []:
        at = stamp_of(str(verdict.get("at", "")))
        failed = json.dumps([{"name": str(name), "message": ""} for name in verdict.get("failed", [])])
        conn.execute(
            "INSERT INTO verdicts (node, at, ok, failed) SELECT ?, ?, ?, ?"
            " WHERE NOT EXISTS (SELECT 1 FROM verdicts WHERE node = ? AND at >= ?)",
            (node, at, 1 if verdict.get("ok") else 0, failed, node, at),
        )
    for path in sorted(site.runs_dir.glob("*/corectl.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # a run killed while writing its record
        if isinstance(record, dict):
            _add_run(conn, path.parent.name, record)
    try:
        at, detail = (site.directory / OLD_MARK).read_text(encoding="utf-8").split()[:2]
    except (OSError, ValueError):
        return
    conn.execute("INSERT OR IGNORE INTO marks (name, at, detail) VALUES (?, ?, ?)", (HAS_RUN, stamp_of(at), detail))


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
def _one_line(path: Path) -> Iterator[None]:
    """sqlite's and the OS's errors while the store is used: a StoreUnavailable naming the file."""
    try:
        yield
    except (sqlite3.Error, OSError) as exc:
        raise StoreUnavailable(f"{path}: {exc}") from None


@contextmanager
def writing(site: Site) -> Iterator[sqlite3.Connection]:
    """The store to write, created or migrated as needed."""
    path = site.history_db
    with _one_line(path), closing(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)) as conn:
        _use_wal(conn)
        if _migrate(conn, site):
            for old in (site.directory / OLD_HEALTH, site.directory / OLD_MARK):
                old.unlink(missing_ok=True)
        yield conn


def _wal(path: Path) -> Path:
    """The writer's write-ahead log beside the store's file (its -shm index beside it too)."""
    return path.with_name(path.name + "-wal")


def remove(site: Site) -> None:
    """Delete the site's store: its file, the writer's WAL and its index (a lab whose machines are gone)."""
    path = site.history_db
    for each in (path, _wal(path), path.with_name(path.name + "-shm")):
        each.unlink(missing_ok=True)


def _open_read_only(path: Path) -> sqlite3.Connection:
    """The file without writing beside it: SQLite's read-only mode creates the WAL's -shm and -wal files when no
    writer has them open and leaves them there, so the file is opened as immutable while it has no WAL (no
    writer), and read-only, through the writer's WAL, otherwise. A writer that starts during an immutable read
    writes to its WAL, unseen by the read; were it to end and copy its WAL into the file within the read's few
    milliseconds, the read could find the file inconsistent: a StoreUnavailable (one warning line), not a
    wrong answer, and the next read is whole."""
    mode = "mode=ro" if _wal(path).exists() else "immutable=1"
    return sqlite3.connect(f"{path.as_uri()}?{mode}", uri=True, isolation_level=None)


@contextmanager
def reading(site: Site, add: Callable[[sqlite3.Connection], None] | None = None) -> Iterator[sqlite3.Connection]:
    """The store to read. A current file is read as it is; an older one (or none), or one the caller adds rows to
    (``add``: Slurm's drains of now), is copied into memory, migrated there, the older stores taken in there, and
    ``add`` applied there. Nothing is written to the site either way."""
    path = site.history_db
    with _one_line(path):
        memory = sqlite3.connect(":memory:", isolation_level=None)
        with closing(memory):
            if path.is_file():
                with closing(_open_read_only(path)) as source:
                    if add is None and _version(source) == SCHEMA_VERSION:
                        yield source
                        return
                    source.backup(memory)
            _migrate(memory, site)
            if add is not None:
                add(memory)
            yield memory


# --------------------------------------------------------------------------- runs and marks


def _add_run(conn: sqlite3.Connection, ident: str, record: dict[str, Any]) -> None:
    started = stamp_of(str(record.get("started", "")))
    conn.execute(
        "INSERT OR REPLACE INTO runs (id, started, record) VALUES (?, ?, ?)",
        (ident, started, json.dumps(record, sort_keys=True)),
    )


def add_run(site: Site, ident: str, record: dict[str, Any]) -> None:
    """A run's record in the index (a second one of the same run replaces the first). The index holds the runs
    whose folders are kept: prune_runs forgets the others; marks outlive them."""
    with writing(site) as conn, transaction(conn):
        _add_run(conn, ident, record)


def forget_runs(site: Site, idents: list[str]) -> None:
    """The index rows of runs whose folders are gone (corectl.ansible.records.prune_runs)."""
    if idents:
        with writing(site) as conn, transaction(conn):
            conn.executemany("DELETE FROM runs WHERE id = ?", [(ident,) for ident in idents])


def runs(site: Site) -> list[dict[str, Any]]:
    """Every run's record, oldest first, with its id (``id``) and its start as the store writes it."""
    with reading(site) as conn:
        rows = conn.execute("SELECT id, started, record FROM runs ORDER BY started, id").fetchall()
    return [{**json.loads(record), "id": ident, "started": started} for ident, started, record in rows]


def mark(site: Site, name: str, at: datetime, detail: str = "") -> None:
    """Set the mark ``name`` (the newest setting wins)."""
    with writing(site) as conn, transaction(conn):
        conn.execute("INSERT OR REPLACE INTO marks (name, at, detail) VALUES (?, ?, ?)", (name, stamp(at), detail))


def marked(site: Site, name: str) -> tuple[str, str] | None:
    """(when, detail) of the mark ``name``; None when it was never set."""
    with reading(site) as conn:
        row = conn.execute("SELECT at, detail FROM marks WHERE name = ?", (name,)).fetchone()
    return (str(row[0]), str(row[1])) if row else None

"""Issue 46: one store for the site's state (corectl.store). A site as the stores before it left it (the history
at schema version 2, .health.json, the run records' corectl.json, .runs/site-has-run) reads the same through the
store without a byte changing, and the first command that writes takes it all in, once."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conftest import ROOT
from corectl import store
from corectl.ansible.records import load_runs, site_has_run
from corectl.health import failures
from corectl.health.report import last_verdicts
from corectl.site import Site

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def old_site(tmp_path: Path) -> Site:
    """A site whose state is in the four places of before: dgx01's last verdict in both the history and
    .health.json (the history's newer), dgx02's only in .health.json (the history was unwritable then)."""
    site = Site(root=ROOT, directory=tmp_path / "prod")
    site.directory.mkdir()
    with sqlite3.connect(site.history_db) as conn:
        for statements in store.MIGRATIONS[:2]:
            for statement in statements:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(
            "INSERT INTO verdicts (node, at, ok, failed, run_id) VALUES ('dgx01', '2026-11-29T10:00:00Z', 0,"
            ' \'[{"name": "xid", "message": "Xid 79"}]\', \'r2\')'
        )
    conn.close()
    (site.directory / ".health.json").write_text(
        json.dumps({
            "dgx01": {"at": "2026-11-28 09:00:00Z", "ok": True, "failed": []},
            "dgx02": {"at": "2026-11-29 08:30:00Z", "ok": False, "failed": ["ecc", "pcie"]},
        })
    )  # fmt: skip
    for ident, playbook, started in (
        ("20261127T050000Z-100", "site.yml", "2026-11-27T05:00:00+00:00"),
        ("20261129T100000Z-200", "health.yml", "2026-11-29T10:00:00+00:00"),
    ):
        (site.runs_dir / ident).mkdir(parents=True)
        record = {"command": "x", "playbook": playbook, "status": "successful", "check": False, "started": started}
        (site.runs_dir / ident / "corectl.json").write_text(json.dumps(record))
    (site.runs_dir / "site-has-run").write_text("2026-11-27T05:00:00+00:00 20261127T050000Z-100\n")
    return site


def test_an_old_site_reads_the_same_through_the_store_and_nothing_is_written(old_site: Site):
    before = snapshot(old_site.directory)
    assert last_verdicts(old_site) == {
        "dgx01": "FAIL xid 2026-11-29 10:00:00Z",
        "dgx02": "FAIL ecc,pcie 2026-11-29 08:30:00Z",
    }
    assert [(r["id"], r["started"]) for r in load_runs(old_site)] == [
        ("20261127T050000Z-100", "2026-11-27T05:00:00Z"),
        ("20261129T100000Z-200", "2026-11-29T10:00:00Z"),
    ]
    assert site_has_run(old_site)
    assert store.marked(old_site, store.HAS_RUN) == ("2026-11-27T05:00:00Z", "20261127T050000Z-100")
    assert snapshot(old_site.directory) == before


def test_the_first_write_takes_the_old_stores_in_once(old_site: Site):
    failures.record_action(old_site, "dgx02", "heal: reboot", "ok", "", NOW)
    assert not (old_site.directory / ".health.json").exists()
    assert not (old_site.runs_dir / "site-has-run").exists()
    assert sorted(p.name for p in old_site.runs_dir.iterdir()) == ["20261127T050000Z-100", "20261129T100000Z-200"]
    with sqlite3.connect(old_site.history_db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (3,)
        verdicts = conn.execute("SELECT node, at, ok, failed FROM verdicts ORDER BY node, at").fetchall()
        runs = conn.execute("SELECT id, started FROM runs ORDER BY id").fetchall()
        marks = conn.execute("SELECT name, at, detail FROM marks").fetchall()
    conn.close()
    assert verdicts == [
        ("dgx01", "2026-11-29T10:00:00Z", 0, '[{"name": "xid", "message": "Xid 79"}]'),  # the older one not added
        ("dgx02", "2026-11-29T08:30:00Z", 0, '[{"name": "ecc", "message": ""}, {"name": "pcie", "message": ""}]'),
    ]
    assert runs == [("20261127T050000Z-100", "2026-11-27T05:00:00Z"), ("20261129T100000Z-200", "2026-11-29T10:00:00Z")]
    assert marks == [("site-has-run", "2026-11-27T05:00:00Z", "20261127T050000Z-100")]
    # taken in once: a record written by hand now is no run of the index (runs are added as they end)
    (old_site.runs_dir / "20261130T000000Z-300").mkdir()
    (old_site.runs_dir / "20261130T000000Z-300" / "corectl.json").write_text('{"started": "2026-11-30T00:00:00Z"}')
    failures.record_action(old_site, "dgx02", "heal: reboot", "ok", "", NOW)
    assert [r["id"] for r in load_runs(old_site)] == ["20261127T050000Z-100", "20261129T100000Z-200"]
    assert last_verdicts(old_site)["dgx02"] == "FAIL ecc,pcie 2026-11-29 08:30:00Z"


def test_a_new_site_has_no_store_until_a_command_writes(tmp_path: Path):
    site = Site(root=ROOT, directory=tmp_path / "new")
    site.directory.mkdir()
    assert (last_verdicts(site), load_runs(site), site_has_run(site)) == ({}, [], False)
    assert list(site.directory.iterdir()) == []
    store.mark(site, store.HAS_RUN, NOW, "20261130T120000Z-1")
    assert store.marked(site, store.HAS_RUN) == ("2026-11-30T12:00:00Z", "20261130T120000Z-1")

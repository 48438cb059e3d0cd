"""Failure history: every health verdict, remediation action and Slurm drain in inventories/<site>/.history.sqlite,
repeat offenders, the RMA report, `corectl history NODE` and `corectl rma` (no Ansible, no nodes: the Slurm state
they read on the controller is given by the tests)."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import ROOT, returned
from corectl import store
from corectl.ansible.events import HostStats, RunRequest, RunResult
from corectl.cli import app
from corectl.commands import failures as failures_cmd
from corectl.commands.failures import history_view, rma_json, rma_view
from corectl.commands.status import status_table
from corectl.errors import CorectlError
from corectl.health import failures
from corectl.health import report as health_mod
from corectl.health.failures import Action, Drain, FailedCheck, Verdict, site_offenders, thresholds
from corectl.node_state import NodeState
from corectl.site import Site, groupvars
from corectl.site.context import Context
from corectl.slurm import NodeEvent, SlurmStatus, parse_events

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
XID = "Xid 79 on GPU 3 (fallen off the bus)"
ECC = "GPU 3: 2 uncorrectable volatile ECC errors, 1 retired page pending; reset the GPU"


def report(node: str, *failed: tuple[str, str]) -> dict[str, Any]:
    """A normalized health report: the failing checks given, and a passing and a skipped one."""
    checks = [{"name": name, "status": "fail", "message": message} for name, message in failed]
    checks += [{"name": "gpu-count", "status": "pass", "message": "8 GPUs"}, {"name": "dcgm-diag", "status": "skip"}]
    return {"node": node, "ok": not failed, "checks": checks}


@pytest.fixture
def site(prod_copy: Path) -> Site:
    return Site(root=ROOT, directory=prod_copy)


@pytest.fixture(autouse=True)
def slurm_events(monkeypatch: pytest.MonkeyPatch) -> list[NodeEvent]:
    """What `corectl history` and `corectl rma` read on the controller first: these events (none
    unless a test adds some)."""
    events: list[NodeEvent] = []
    monkeypatch.setattr(failures_cmd, "read_slurm_status", lambda ctx, event_days: SlurmStatus(events=list(events)))
    return events


def no_warning(line: str) -> None:
    raise AssertionError(f"unexpected warning: {line}")


def rows(site: Site, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(site.history_db) as conn:
        return conn.execute(sql).fetchall()


def fail_at(site: Site, node: str, at: datetime, run: str, *checks: tuple[str, str]) -> None:
    failures.record_verdicts(site, {node: report(node, *(checks or [("xid", XID)]))}, at, run)


def lines_of(renderable: object, width: int = 80) -> list[str]:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(renderable)
    return [line.rstrip() for line in console.export_text().splitlines()]


# --------------------------------------------------------------------------- recording and the schema


def test_a_health_run_is_one_row_per_node_with_its_failing_checks(site: Site):
    reports = {"dgx01": report("dgx01"), "dgx07": report("dgx07", ("xid", XID), ("ecc", ECC))}
    assert failures.record_verdicts(site, reports, NOW, "20261123T100000Z-4242") == 2
    assert rows(site, "SELECT node, at, ok, failed, run_id FROM verdicts ORDER BY node") == [
        ("dgx01", "2026-11-23T10:00:00Z", 1, "[]", "20261123T100000Z-4242"),
        (
            "dgx07",
            "2026-11-23T10:00:00Z",
            0,
            json.dumps([{"name": "xid", "message": XID}, {"name": "ecc", "message": ECC}]),
            "20261123T100000Z-4242",
        ),
    ]
    # the same run recorded again adds nothing; a run without an id is a run of its own each time
    assert failures.record_verdicts(site, reports, NOW, "20261123T100000Z-4242") == 0
    assert failures.record_verdicts(site, reports, NOW) == 2
    assert failures.record_verdicts(site, reports, NOW) == 2
    assert rows(site, "SELECT COUNT(*) FROM verdicts") == [(6,)]


def test_actions_are_recorded_and_shown_with_the_verdicts_newest_first(site: Site):
    fail_at(site, "dgx07", NOW - timedelta(hours=2), "r1")
    failures.record_verdicts(site, {"dgx07": report("dgx07")}, NOW, "r2")
    failures.record_action(site, "dgx07", "drain", "ok", "corectl-health: xid", NOW - timedelta(hours=2))
    failures.record_action(site, "dgx07", "reset-gpu", "failed", "GPU 3 busy", NOW - timedelta(hours=1))
    failures.record_action(site, "dgx08", "reboot", "ok", "", NOW)
    assert failures.node_history(site, "dgx07", 10) == [
        Verdict("dgx07", "2026-11-23T10:00:00Z", True, (), "r2"),
        Action("dgx07", "2026-11-23T09:00:00Z", "reset-gpu", "failed", "GPU 3 busy"),
        Action("dgx07", "2026-11-23T08:00:00Z", "drain", "ok", "corectl-health: xid"),  # same second: after it
        Verdict("dgx07", "2026-11-23T08:00:00Z", False, (FailedCheck("xid", XID),), "r1"),
    ]
    assert [e.at for e in failures.node_history(site, "dgx07", 2)] == ["2026-11-23T10:00:00Z", "2026-11-23T09:00:00Z"]
    assert failures.node_history(site, "nobody", 10) == []


def test_the_schema_has_a_version_and_the_file_is_in_wal_mode(site: Site):
    assert failures.node_history(site, "dgx01", 5) == []
    assert not site.history_db.exists()  # reading never creates the file
    failures.record_verdicts(site, {"dgx01": report("dgx01")}, NOW)
    assert store.SCHEMA_VERSION == 3
    assert rows(site, "PRAGMA user_version") == [(store.SCHEMA_VERSION,)]
    assert rows(site, "PRAGMA journal_mode") == [("wal",)]
    tables = {name for (name,) in rows(site, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"verdicts", "actions", "drains", "runs", "marks"}


def test_a_file_from_a_newer_corectl_is_refused_in_one_line(site: Site):
    with sqlite3.connect(site.history_db) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(failures.StoreUnavailable) as caught:
        failures.record_verdicts(site, {"dgx01": report("dgx01")}, NOW)
    assert "schema version 99 is newer" in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(failures.StoreUnavailable):
        failures.repeat_offenders(site, 3, 7, NOW)


def test_an_older_file_is_migrated_when_opened(site: Site):
    sqlite3.connect(site.history_db).close()  # an empty file: schema version 0
    fail_at(site, "dgx07", NOW, "r1")
    assert rows(site, "PRAGMA user_version") == [(3,)]
    assert failures.repeat_offenders(site, 1, 7, NOW).counts == {"dgx07": 1}
    # a file of version 1 (verdicts and actions) gains the drains and keeps its rows
    with sqlite3.connect(site.history_db) as conn:
        for table in ("drains", "runs", "marks"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("PRAGMA user_version = 1")
    assert failures.record_slurm_events(site, [NodeEvent("dgx07", 1795600000, None, "DRAIN", "root(0)", "x")]) == 1
    assert rows(site, "PRAGMA user_version") == [(3,)]
    assert rows(site, "SELECT COUNT(*) FROM verdicts") == [(1,)]


# --------------------------------------------------------------------------- repeat offenders


def test_repeat_offenders_count_failing_runs_in_the_window(site: Site):
    since = NOW - timedelta(days=7)
    # dgx01: exactly 3, the oldest exactly at the window's start (included)
    for n, at in enumerate([since, NOW - timedelta(days=3), NOW]):
        fail_at(site, "dgx01", at, f"a{n}")
    # dgx02: 2 in the window (N-1), a third one second before it, a fourth in the future
    for n, at in enumerate([NOW - timedelta(days=1), NOW - timedelta(hours=1)]):
        fail_at(site, "dgx02", at, f"b{n}")
    fail_at(site, "dgx02", since - timedelta(seconds=1), "b-old")
    fail_at(site, "dgx02", NOW + timedelta(seconds=1), "b-future")
    # dgx03: 3 runs with two failing checks each count 3 times, not 6; its passing runs not at all
    for n in range(3):
        fail_at(site, "dgx03", NOW - timedelta(days=n), f"c{n}", ("xid", XID), ("ecc", ECC))
        failures.record_verdicts(site, {"dgx03": report("dgx03")}, NOW - timedelta(days=n, hours=1), f"c-ok{n}")
    # dgx04: 4 failures, most first
    for n in range(4):
        fail_at(site, "dgx04", NOW - timedelta(days=n, hours=2), f"d{n}")
    offenders = failures.repeat_offenders(site, 3, 7, NOW)
    assert offenders.counts == {"dgx04": 4, "dgx01": 3, "dgx03": 3}
    assert list(offenders.counts) == ["dgx04", "dgx01", "dgx03"]
    assert (offenders.since, offenders.until) == ("2026-11-16T10:00:00Z", "2026-11-23T10:00:00Z")
    # one second later the oldest of dgx01 leaves the window; with N-1 = 2, dgx02 is in
    assert "dgx01" not in failures.repeat_offenders(site, 3, 7, NOW + timedelta(seconds=1)).counts
    assert failures.repeat_offenders(site, 2, 7, NOW).counts["dgx02"] == 2


def test_no_history_means_no_offender(site: Site):
    assert failures.repeat_offenders(site, 3, 7, NOW).counts == {}
    assert failures.rma_report(site, 3, 7, NOW)[1] == []


# --------------------------------------------------------------------------- RMA report


def rma_site(site: Site) -> None:
    """dgx07: 4 failing runs (xid, then ecc too) and a failed GPU reset; dgx12: 3; dgx01: 1; an old one."""
    for n in range(4):
        checks = [("xid", XID), ("ecc", ECC)] if n == 0 else [("xid", XID)]
        fail_at(site, "dgx07", NOW - timedelta(days=n), f"r{n}", *checks)
    failures.record_action(site, "dgx07", "reset-gpu", "failed", "GPU 3 busy", NOW - timedelta(hours=1))
    failures.record_action(site, "dgx07", "drain", "ok", "long ago", NOW - timedelta(days=30))
    for n in range(3):
        fail_at(site, "dgx12", NOW - timedelta(days=n, hours=3), f"r{n}", ("gpu-count", "7 of 8 GPUs visible"))
    fail_at(site, "dgx01", NOW, "r0")
    for n in range(5):
        fail_at(site, "dgx02", NOW - timedelta(days=20 + n), f"old{n}")


def test_rma_report_lists_repeat_offenders_with_their_evidence(site: Site):
    rma_site(site)
    offenders, cases = failures.rma_report(site, 3, 7, NOW)
    assert offenders.counts == {"dgx07": 4, "dgx12": 3}
    assert [case.node for case in cases] == ["dgx07", "dgx12"]
    dgx07 = cases[0]
    assert [v.at for v in dgx07.failures] == [
        "2026-11-23T10:00:00Z",
        "2026-11-22T10:00:00Z",
        "2026-11-21T10:00:00Z",
        "2026-11-20T10:00:00Z",
    ]
    assert dgx07.failures[0].failed == (FailedCheck("xid", XID), FailedCheck("ecc", ECC))
    assert dgx07.actions == (Action("dgx07", "2026-11-23T09:00:00Z", "reset-gpu", "failed", "GPU 3 busy"),)
    data = rma_json(site, offenders, cases)
    assert data["failures"] == 3 and data["days"] == 7 and data["site"] == "prod"
    assert [(n["node"], n["failures"]) for n in data["nodes"]] == [("dgx07", 4), ("dgx12", 3)]
    assert data["nodes"][1]["evidence"][0] == {
        "at": "2026-11-23T07:00:00Z",
        "run_id": "r0",
        "checks": [{"name": "gpu-count", "message": "7 of 8 GPUs visible"}],
    }
    assert data["nodes"][0]["actions"] == [
        {"at": "2026-11-23T09:00:00Z", "action": "reset-gpu", "outcome": "failed", "detail": "GPU 3 busy"}
    ]


def test_rma_text_at_80_columns(site: Site):
    rma_site(site)
    lines = lines_of(rma_view(site, *failures.rma_report(site, 3, 7, NOW)))
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0] == "RMA: 2 candidates in prod (>=3 failures in 7 days)"
    assert lines[1] == "dgx07: 4 failures"
    rows_of_dgx07 = [line.split()[:4] for line in lines[2 : lines.index("dgx12: 3 failures")]]
    assert [row for row in rows_of_dgx07 if row[0][:2] == "20"] == [
        ["2026-11-23", "10:00:00Z", "FAIL", "xid:"],
        ["2026-11-23", "09:00:00Z", "reset-gpu", "failed:"],  # the GPU reset tried after it
        ["2026-11-22", "10:00:00Z", "FAIL", "xid:"],
        ["2026-11-21", "10:00:00Z", "FAIL", "xid:"],
        ["2026-11-20", "10:00:00Z", "FAIL", "xid:"],
    ]
    assert not any("long ago" in line for line in lines)  # an action before the window is no evidence
    assert not any(line.startswith(("dgx01", "dgx02")) for line in lines)
    none = lines_of(rma_view(site, *failures.rma_report(site, 5, 7, NOW)))
    assert none == ["RMA: no candidate in prod (no node with >=5 failures in 7 days)"]


# --------------------------------------------------------------------------- corectl history NODE


def test_history_at_80_columns_one_row_per_entry_newest_first(site: Site):
    node = "corectl-labtest-e2e-dgx01"
    for n in range(3):
        fail_at(site, node, NOW - timedelta(days=n), f"r{n}", ("xid", XID), ("ecc", ECC))
    failures.record_verdicts(site, {node: report(node)}, NOW - timedelta(days=3), "r3")
    failures.record_action(site, node, "drain", "ok", "corectl-health: xid: " + XID, NOW - timedelta(hours=1))
    lines = lines_of(history_view(Context(site, writes=False), node, 20, no_warning))
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0] == f"{node} in prod: 5 verdicts, actions and drains, newest first"
    starts = [line.split()[:3] for line in lines[1:] if not line.startswith(" ")]
    assert starts == [
        ["2026-11-23", "10:00:00Z", "FAIL"],
        ["2026-11-23", "09:00:00Z", "drain"],
        ["2026-11-22", "10:00:00Z", "FAIL"],
        ["2026-11-21", "10:00:00Z", "FAIL"],
        ["2026-11-20", "10:00:00Z", "ok"],
    ]
    text = " ".join(" ".join(lines).split())
    assert f"xid: {XID}; ecc: GPU 3: 2 uncorrectable volatile ECC errors" in text
    more = lines_of(history_view(Context(site, writes=False), node, 2, no_warning), width=200)
    assert more[0] == f"{node} in prod: 2 verdicts, actions and drains, newest first (older ones: --last 4)"
    assert lines_of(history_view(Context(site, writes=False), "dgx99", 20, no_warning)) == [
        "dgx99: nothing recorded in prod (corectl health records verdicts)"
    ]


def test_cli_history_and_rma(site: Site):
    now = datetime.now(UTC)
    for n in range(3):
        fail_at(site, "dgx07", now - timedelta(hours=n + 1), f"r{n}")
    runner = CliRunner()
    shown = runner.invoke(app, ["history", "dgx07", "--inventory", str(site.directory), "--last", "2"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[0].startswith("dgx07 in prod: 2 verdicts, actions and drains, newest first")
    assert len(shown.stdout.splitlines()) == 3
    data = json.loads(runner.invoke(app, ["rma", "--inventory", str(site.directory), "--json"]).stdout)
    assert [(n["node"], n["failures"]) for n in data["nodes"]] == [("dgx07", 3)]
    stricter = runner.invoke(app, ["rma", "--inventory", str(site.directory), "--json", "--failures", "4"])
    assert json.loads(stricter.stdout)["nodes"] == []
    missing = runner.invoke(app, ["history", "dgx07", "--inventory", str(site.directory / "nosuch")])
    assert missing.exit_code == 2 and "not found" in missing.stderr


def test_help_lists_history_and_rma():
    listed = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"}).output
    assert " history " in listed and " rma " in listed
    for command in ("history", "rma"):
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "100"})
        assert result.exit_code == 0 and "<bool>" not in result.output


# --------------------------------------------------------------------------- thresholds from group_vars


def test_thresholds_come_from_group_vars_and_the_site_overrides_them(site: Site):
    assert thresholds(site) == (3, 7)  # group_vars/all/health.yml
    (site.directory / "group_vars").mkdir()
    (site.directory / "group_vars" / "all.yml").write_text("corectl_repeat_offender_days: 14\n")
    assert thresholds(site) == (3, 14)
    assert thresholds(site, 5, None) == (5, 14)
    assert thresholds(site, 2, 1) == (2, 1)
    (site.directory / "group_vars" / "all.yml").write_text("corectl_repeat_offender_failures: '{{ x }}'\n")
    with pytest.raises(CorectlError) as caught:
        thresholds(site)
    assert caught.value.exit_code == 2
    assert "corectl_repeat_offender_failures must be a whole number >= 1" in str(caught.value)


def test_group_all_is_read_as_ansible_layers_it(site: Site):
    folder = site.directory / "group_vars" / "all"
    folder.mkdir(parents=True)
    (folder / "10-health.yml").write_text("corectl_repeat_offender_failures: 5\ncorectl_repeat_offender_days: 9\n")
    (folder / "20-later.yaml").write_text(
        "corectl_repeat_offender_days: '10'\nsecret: !vault |\n  $ANSIBLE_VAULT;1.1\n"
    )
    (folder / "30-vaulted.yml").write_text("$ANSIBLE_VAULT;1.1;AES256\n6162636465\n")  # a whole-file vault
    (folder / ".hidden.yml").write_text("corectl_repeat_offender_failures: 1\n")
    (folder / "notes.txt").write_text("corectl_repeat_offender_failures: 1\n")
    values = groupvars.all_vars(site)
    assert values["base_timezone"] == "{{ corectl_cluster.timezone }}"  # the shared group_vars/all
    assert values["secret"] is None
    assert thresholds(site) == (5, 10)


def test_the_shared_thresholds_are_in_health_yml():
    text = (ROOT / "group_vars" / "all" / "health.yml").read_text()
    assert "\ncorectl_repeat_offender_failures: 3\n" in text
    assert "\ncorectl_repeat_offender_days: 7\n" in text


# --------------------------------------------------------------------------- corectl status


def test_status_names_the_repeat_offenders_it_knows(site: Site):
    rma_site(site)
    offenders = failures.repeat_offenders(site, 3, 7, NOW)
    states = {f"dgx{i:02d}": NodeState("idle") for i in range(1, 12)}  # dgx12: no longer in Slurm
    lines = lines_of(status_table(SlurmStatus(states=states), {}, offenders))
    assert lines[-1] == "repeat offenders (>=3 failures in 7 days): dgx07 (4)"
    states["dgx12"] = NodeState("drain", "corectl-health: gpu-count")
    lines = lines_of(status_table(SlurmStatus(states=states), {}, offenders))
    assert lines[-1] == "repeat offenders (>=3 failures in 7 days): dgx07 (4), dgx12 (3)"
    assert not any("repeat" in line for line in lines_of(status_table(SlurmStatus(states=states), {})))


def test_status_warns_when_the_history_cannot_be_read(site: Site):
    site.history_db.write_text("not a database, " * 100)
    said: list[str] = []
    assert site_offenders(site, NOW, said.append) is None
    assert len(said) == 1 and said[0].startswith("warning: repeat offenders not shown: ")


# --------------------------------------------------------------------------- an unwritable history


@pytest.mark.parametrize("obstacle", ["directory", "garbage"])
def test_an_unwritable_history_is_a_warning_not_a_crash(site: Site, obstacle: str):
    if obstacle == "directory":
        site.history_db.mkdir()  # cannot be opened as a file, even by root
    else:
        site.history_db.write_text("not a database, " * 100)
    said: list[str] = []
    health_mod.remember(site, {"dgx07": report("dgx07", ("xid", XID))}, "r1", warn=said.append)
    assert len(said) == 1, said
    assert said[0].startswith(f"warning: failure history not recorded: {site.history_db}: ")
    assert "\n" not in said[0]
    assert not (site.directory / ".health.json").exists()  # one store: no second place for the verdict


# --------------------------------------------------------------------------- concurrent writers

WRITER = textwrap.dedent(
    """
    import sys, time
    from datetime import UTC, datetime
    from pathlib import Path
    from corectl.health.failures import record_verdicts
    from corectl.site import Site

    root, directory, who, runs = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    site = Site(root=Path(root), directory=directory)
    (directory / f"ready-{who}").touch()
    while not (directory / "go").exists():
        time.sleep(0.005)
    bad = {"node": "x", "ok": False, "checks": [{"name": "xid", "status": "fail", "message": who}]}
    for run in range(runs):
        nodes = {f"{who}-dgx{n}": bad for n in range(3)}
        record_verdicts(site, nodes, datetime.now(UTC), f"{who}-{run}")
        time.sleep(0.002)  # a breath between runs, so that neither writer can starve the other
    """
)


def test_two_processes_appending_at_once_lose_no_row(site: Site):
    runs = 150
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(ROOT), str(site.directory), who, str(runs)])
        for who in ("a", "b")
    ]
    deadline = datetime.now(UTC) + timedelta(seconds=60)
    while not all((site.directory / f"ready-{who}").exists() for who in ("a", "b")):
        assert datetime.now(UTC) < deadline, "the writers did not start"
    (site.directory / "go").touch()  # both open the new file, create the schema and write at once
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    assert rows(site, "SELECT COUNT(*), COUNT(DISTINCT run_id) FROM verdicts") == [(2 * runs * 3, 2 * runs)]
    order = [run_id[0] for (run_id,) in rows(site, "SELECT run_id FROM verdicts ORDER BY id")]
    switches = sum(1 for x, y in pairwise(order) if x != y)
    assert switches >= 2, "the writers did not overlap"  # a, then b, then a again at least


# --------------------------------------------------------------------------- corectl health records


@pytest.fixture
def fake_health(monkeypatch: pytest.MonkeyPatch, site: Site) -> str:
    """The run replaced: dgx01 healthy, dgx07 fails xid and ecc; returns the run's id."""
    run_id = "20261123T100000Z-4242"

    def run_site(request: RunRequest, sink: Any = None, **_: Any) -> RunResult:
        for node, said in [("dgx01", report("dgx01")), ("dgx07", report("dgx07", ("xid", XID), ("ecc", ECC)))]:
            res = {"rc": 0 if said["ok"] else 1, "stdout": json.dumps(said)}
            sink(returned(health_mod.RETURNED, node, res))
        hosts = {"dgx01": HostStats(ok=1), "dgx07": HostStats(ok=1)}
        return RunResult("successful", 0, hosts, site.runs_dir / run_id, 1.0)

    monkeypatch.setattr(health_mod.ansible, "run", run_site)
    return run_id


def test_corectl_health_records_every_verdict(site: Site, fake_health: str):
    result = CliRunner().invoke(app, ["health", "--inventory", str(site.directory), "--json"])
    assert result.exit_code == 1, result.output
    assert "warning" not in result.stderr
    history = failures.node_history(site, "dgx07", 10)
    assert len(history) == 1
    verdict = history[0]
    assert isinstance(verdict, Verdict)
    assert (verdict.ok, verdict.run_id) == (False, fake_health)
    assert verdict.failed == (FailedCheck("xid", XID), FailedCheck("ecc", ECC))
    assert abs(datetime.fromisoformat(verdict.at) - datetime.now(UTC)) < timedelta(minutes=5)
    assert [e.ok for e in failures.node_history(site, "dgx01", 10) if isinstance(e, Verdict)] == [True]
    shown = CliRunner().invoke(app, ["history", "dgx07", "--inventory", str(site.directory)], env={"COLUMNS": "80"})
    assert shown.stdout.splitlines()[1].split()[2:4] == ["FAIL", "xid:"]


def test_corectl_health_warns_but_reports_when_the_history_is_unwritable(site: Site, fake_health: str):
    site.history_db.mkdir()
    result = CliRunner().invoke(app, ["health", "--inventory", str(site.directory)])
    assert result.exit_code == 1, result.output  # dgx07 failed: the usual exit, not a crash
    assert "health: 2 nodes checked, 1 passed, 1 failed" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: failure history")]
    assert len(warnings) == 1, result.stderr


# --------------------------------------------------------------------------- Slurm's drains (issue 33)

# `sacctmgr -n -P show event format=NodeName,TimeStart,TimeEnd,State,User,Reason states=drain,down` with
# SLURM_TIME_FORMAT=%s, as Slurm 22.05 printed it in the lab (its cluster's own lines have no node)
SACCTMGR = """|1795653858|1795653963|||Cluster Registered TRES
e2e-dgx03|1795653971|1795654043|DRAIN*|root(0)|corectl add-node: not yet checked
e2e-dgx01|1795660000|Unknown|DRAIN|root(0)|corectl-health: xid: XID 119 on PCI:0000:9a:00: Timeout | and more
"""
T0 = int(NOW.timestamp())


def test_slurms_events_are_read_from_sacctmgr():
    assert parse_events(SACCTMGR.splitlines()) == [
        NodeEvent("e2e-dgx03", 1795653971, 1795654043, "DRAIN*", "root(0)", "corectl add-node: not yet checked"),
        NodeEvent("e2e-dgx01", 1795660000, None, "DRAIN", "root(0)",
                  "corectl-health: xid: XID 119 on PCI:0000:9a:00: Timeout | and more"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "user", "failure"),
    [
        ("corectl-health: xid: XID 119 on PCI:0000:9a:00", "root(0)", True),  # Slurm's health program
        ("corectl-epilog: job 12 left pid 4242 (python) on GPU 3, still there after SIGKILL", "root(0)", True),
        ("corectl: needs hardware service (xid)", "root(0)", True),  # heal gave up
        ("corectl burn-in: bus bandwidth 117.6 GB/s at 8 GiB < expected 450 GB/s", "root(0)", True),
        ("Not responding", "slurm(64030)", True),  # Slurm itself
        ("Kill task failed", "slurm(64030)", True),
        ("DIMM swap", "root(0)", False),  # an operator's
        ("corectl upgrade drivers: 580.105.08", "root(0)", False),
        ("corectl add-node: not yet checked", "root(0)", False),
    ],
)
def test_a_drain_is_a_failure_or_planned_work(reason: str, user: str, failure: bool):
    assert failures.is_failure(reason, user) is failure


def test_slurms_drains_are_kept_once_and_their_end_updated(site: Site):
    still = NodeEvent("dgx07", T0, None, "DRAIN", "root(0)", "corectl-health: xid: XID 119")
    assert failures.record_slurm_events(site, [still]) == 1
    ended = still._replace(end=T0 + 600, state="DRAIN*")
    assert failures.record_slurm_events(site, [ended]) == 0
    assert failures.node_history(site, "dgx07", 5) == [
        Drain("dgx07", "2026-11-23T10:00:00Z", "2026-11-23T10:10:00Z", "DRAIN*", "root(0)",
              "corectl-health: xid: XID 119", True),
    ]  # fmt: skip


def drain(node: str, start: datetime, minutes: int | None, reason: str, user: str = "root(0)") -> NodeEvent:
    end = None if minutes is None else int(start.timestamp()) + minutes * 60
    return NodeEvent(node, int(start.timestamp()), end, "DRAIN", user, reason)


def test_each_failure_counts_once_and_planned_drains_not_at_all(site: Site):
    hook = "corectl-health: xid: XID 119"
    events = [
        # dgx01: `corectl health` saw it 5 minutes before Slurm's program drained the node, and the drain's
        # reason changed once (a new event, back to back): one failure; a second one days later: two
        drain("dgx01", NOW - timedelta(days=2), 30, hook),
        drain("dgx01", NOW - timedelta(days=2) + timedelta(minutes=30), 60, "corectl-health: fabric: not done"),
        drain("dgx01", NOW - timedelta(hours=5), None, hook),
        # dgx02: planned work only, and a failing run an hour before an operator's drain: one failure
        drain("dgx02", NOW - timedelta(days=1), 120, "DIMM swap"),
        drain("dgx02", NOW - timedelta(days=3), 60, "corectl upgrade drivers: 580.105.08"),
        # dgx03: Slurm's own (not responding), and a failing run 20 minutes before it: two
        drain("dgx03", NOW - timedelta(hours=2), 10, "Not responding", "slurm(64030)"),
    ]
    failures.record_slurm_events(site, events)
    fail_at(site, "dgx01", NOW - timedelta(days=2, minutes=5), "a1")
    fail_at(site, "dgx01", NOW - timedelta(days=2) + timedelta(minutes=45), "a2")  # during the stretch
    fail_at(site, "dgx02", NOW - timedelta(days=1, hours=1), "b1")
    fail_at(site, "dgx03", NOW - timedelta(hours=2, minutes=20), "c1")
    assert failures.repeat_offenders(site, 1, 7, NOW).counts == {"dgx01": 2, "dgx03": 2, "dgx02": 1}
    _, cases = failures.rma_report(site, 2, 7, NOW)
    assert [(c.node, c.count, len(c.failures), len(c.drains)) for c in cases] == [
        ("dgx01", 2, 2, 3),
        ("dgx03", 2, 1, 1),
    ]


def test_history_and_rma_show_the_drains_slurm_recorded(site: Site, slurm_events: list[NodeEvent]):
    now = datetime.now(UTC).replace(microsecond=0)
    slurm_events += [
        drain("dgx07", now - timedelta(hours=3), 60, "corectl-health: xid: XID 119 on PCI:0000:9a:00"),
        drain("dgx07", now - timedelta(minutes=105), 30, "corectl-health: ecc: GPU 1: row remap pending"),
        drain("dgx07", now - timedelta(hours=1), None, "DIMM swap"),
    ]
    fail_at(site, "dgx07", now - timedelta(hours=6), "r1")
    runner = CliRunner()
    shown = runner.invoke(app, ["history", "dgx07", "--inventory", str(site.directory)], env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    lines = [line.rstrip() for line in shown.stdout.splitlines()]
    assert lines[0] == "dgx07 in prod: 4 verdicts, actions and drains, newest first"
    assert [line.split()[2] for line in lines[1:]] == ["DRAIN", "DRAIN", "DRAIN", "FAIL"]
    assert lines[1].endswith("DIMM swap (root(0), still)")
    assert "corectl-health: xid: XID 119 on PCI:0000:9a:00 (root(0), until " in lines[3]
    data = json.loads(runner.invoke(app, ["rma", "--inventory", str(site.directory), "--json"]).stdout)
    [dgx07] = data["nodes"]
    assert dgx07["failures"] == 3  # the run, and Slurm's two drains (not back to back); the operator's is none
    assert [d["reason"][:18] for d in dgx07["drains"]] == ["corectl-health: ec", "corectl-health: xi"]
    # shown, not kept: the reads wrote nothing (heal, which changes the site, keeps them)
    assert sorted(p.name for p in site.directory.glob(".history.sqlite*")) == [".history.sqlite"]
    assert rows(site, "SELECT COUNT(*) FROM drains") == [(0,)]


def test_a_read_while_another_command_writes_sees_its_rows_and_adds_no_file(site: Site):
    """A writer holding the file open keeps its WAL beside it: the read goes through it (read-only), sees what
    was committed, and leaves the WAL's files as they were; once the writer is gone, nothing is left beside."""
    fail_at(site, "dgx07", NOW - timedelta(hours=2), "r1")
    writer = sqlite3.connect(site.history_db, isolation_level=None)
    try:
        writer.execute(
            "INSERT INTO actions (node, at, action, outcome) VALUES ('dgx07', '2026-11-23T11:00:00Z', 'x', 'ok')"
        )
        beside = sorted(p.name for p in site.directory.glob(".history.sqlite*"))
        assert beside == [".history.sqlite", ".history.sqlite-shm", ".history.sqlite-wal"]
        assert [type(e).__name__ for e in failures.node_history(site, "dgx07")] == ["Action", "Verdict"]
        assert sorted(p.name for p in site.directory.glob(".history.sqlite*")) == beside
    finally:
        writer.close()
    assert [p.name for p in site.directory.glob(".history.sqlite*")] == [".history.sqlite"]
    assert len(failures.node_history(site, "dgx07")) == 2
    assert [p.name for p in site.directory.glob(".history.sqlite*")] == [".history.sqlite"]


def test_history_without_the_controller_warns_and_shows_what_is_kept(site: Site, monkeypatch: pytest.MonkeyPatch):
    def unreachable(ctx: Context, event_days: int) -> SlurmStatus:
        raise CorectlError("could not read the Slurm state from the controller (unreachable head01)")

    monkeypatch.setattr(failures_cmd, "read_slurm_status", unreachable)
    fail_at(site, "dgx07", NOW, "r1")
    said: list[str] = []
    lines = lines_of(history_view(Context(site, writes=False), "dgx07", 5, said.append))
    assert said == [
        "warning: Slurm's drains not read, the history is shown as kept: could not read the Slurm state from the"
        " controller (unreachable head01)"
    ]
    assert lines[0] == "dgx07 in prod: 1 verdicts, actions and drains, newest first"

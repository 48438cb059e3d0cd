"""Issue 33: reliability figures from the failure history, against figures computed by hand
(corectl.health.reliability's definitions), and `corectl report` printing them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import ROOT
from corectl.cli import app
from corectl.commands import failures as failures_cmd
from corectl.health import failures
from corectl.health.reliability import failure_class, reliability
from corectl.health.usage import UsageRead
from corectl.site import Site
from corectl.site.context import Context
from corectl.slurm import NodeEvent, SlurmStatus

T0 = datetime(2026, 11, 1, tzinfo=UTC)
UNTIL = T0 + timedelta(days=10)
HOUR = timedelta(hours=1)


@pytest.fixture
def site(prod_copy: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    monkeypatch.setattr(failures_cmd, "read_slurm_status", lambda ctx, event_days: SlurmStatus())
    monkeypatch.setattr(
        failures_cmd,
        "read_usage",
        lambda site, since, until: UsageRead(
            None, None, "usage not read: no head here", "utilisation not read: no head here"
        ),
    )
    return Site(root=ROOT, directory=prod_copy)


def event(node: str, start: datetime, end: datetime | None, reason: str, user: str = "root(0)") -> NodeEvent:
    return NodeEvent(node, int(start.timestamp()), None if end is None else int(end.timestamp()), "DRAIN", user, reason)


def history(site: Site) -> None:
    """nodeA: an Xid drain of 4 h whose reason then became fabric for 2 h more (one failure, 6 h), a failing
    run on day 5 alone (ecc), an operator's day-long drain (planned); nodeB: Slurm's own "Not responding"
    from the day before the period to 2 h into it, and an Xid drain 12 h before the end, still open;
    nodeC: nothing."""
    day1 = T0 + timedelta(days=1)
    failures.record_slurm_events(
        site,
        [
            event("nodeA", day1, day1 + 4 * HOUR, "corectl-health: xid: XID 119 on PCI:0000:9a:00"),
            event("nodeA", day1 + 4 * HOUR, day1 + 6 * HOUR, "corectl-health: fabric: not done"),
            event("nodeA", T0 + timedelta(days=3), T0 + timedelta(days=4), "DIMM swap"),
            event("nodeB", T0 - timedelta(days=1), T0 + 2 * HOUR, "Not responding", "slurm(64030)"),
            event("nodeB", UNTIL - 12 * HOUR, None, "corectl-health: xid: XID 79 on PCI:0000:18:00"),
        ],
    )
    failed = {"node": "nodeA", "ok": False, "checks": [{"name": "ecc", "status": "fail", "message": "row remap"}]}
    failures.record_verdicts(site, {"nodeA": failed}, T0 + timedelta(days=5), "r1")


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("corectl-health: xid: XID 119 on PCI:0000:9a:00", "xid"),
        ("corectl: needs hardware service (gpu-count)", "gpu-count"),
        ("corectl-epilog: job 7 left pid 42 (python) on GPU 3, still there after SIGKILL", "gpu-handover"),
        ("Not responding", "slurm: Not responding"),
        ("corectl validation: nccl: bus bandwidth 117.6 GB/s at 8 GiB < expected 450 GB/s", "nccl"),
        ("corectl validation: dcgm-diag: dcgmi diag -r 2 failed: GPU 3: Fail", "dcgm-diag"),
        ("corectl burn-in: bus bandwidth 117.6 GB/s at 8 GiB < expected 450 GB/s", "nccl"),
    ],
)
def test_a_failure_drain_is_classed_by_its_reason(reason: str, cls: str):
    assert failure_class(reason) == cls


def test_the_figures_are_those_computed_by_hand(site: Site):
    history(site)
    evidence = failures.window_evidence(site, failures.stamp(T0), failures.stamp(UNTIL))
    figures = reliability(["nodeA", "nodeB", "nodeC"], evidence, T0, UNTIL)
    rows = {f.name: (f.failures, f.repaired, f.down, f.mtbf, f.mttr, f.availability) for f in figures.nodes}
    # period 240 h; A: 2 failures, down 6 h; B: 2 failures, down 2 h (in the period) + 12 h (open); C: none
    assert rows == {
        "nodeA": (2, 1, 6 * HOUR, 117 * HOUR, 6 * HOUR, 234 / 240),
        "nodeB": (2, 2, 14 * HOUR, 113 * HOUR, 7 * HOUR, 226 / 240),
        "nodeC": (0, 0, timedelta(), None, None, 1.0),
    }
    fleet = figures.fleet
    assert fleet is not None
    # 3 nodes x 240 h = 720 h, 20 h down, 4 failures, 3 of them repaired; 30 node-days
    assert (fleet.failures, fleet.down, fleet.mtbf, fleet.availability) == (4, 20 * HOUR, 175 * HOUR, 700 / 720)
    assert fleet.mttr == 20 * HOUR / 3
    assert fleet.per_1000_node_days == pytest.approx(1000 * 4 / 30)
    classes = [(c.name, c.failures, c.down, c.mtbf, c.mttr) for c in figures.classes]
    assert classes == [
        ("xid", 2, 18 * HOUR, 350 * HOUR, 9 * HOUR),
        ("ecc", 1, timedelta(), 700 * HOUR, None),  # a failing run alone: no repair time
        ("slurm: Not responding", 1, 2 * HOUR, 700 * HOUR, 2 * HOUR),
    ]
    assert [c.per_1000_node_days for c in figures.classes] == pytest.approx([1000 * 2 / 30, 1000 / 30, 1000 / 30])


def test_corectl_report_prints_those_figures(site: Site, monkeypatch: pytest.MonkeyPatch):
    history(site)
    monkeypatch.setattr(failures_cmd, "read_usage", lambda ctx, since, until: UsageRead(None, None, "", ""))
    ctx = Context(site, writes=False)
    ctx._cluster = Cluster3()  # type: ignore[assignment]
    figures, judged, _ = failures_cmd.report(ctx, UNTIL, 10, lambda line: None)
    console = Console(record=True, width=120, color_system=None, file=StringIO())
    console.print(failures_cmd.report_view(site, figures, judged))
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines[0] == "reliability of prod, 2026-11-01 00:00:00Z to 2026-11-11 00:00:00Z (10 days, 3 nodes)"
    assert lines[1] == (
        "all nodes: 4 failures, MTBF 175.00 h, MTTR 6.67 h, availability 97.222%, 133.33 failures per 1,000 node-days"
    )
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert cells == [
        ["xid", "2", "350.00 h", "9.00 h", "66.67"],
        ["ecc", "1", "700.00 h", "-", "33.33"],  # a failing run alone: no repair time
        ["slurm: Not responding", "1", "700.00 h", "2.00 h", "33.33"],
        ["nodeA", "2", "117.00 h", "6.00 h", "97.500%"],
        ["nodeB", "2", "113.00 h", "7.00 h", "94.167%"],
        ["nodeC", "0", "-", "-", "100.000%"],
    ]
    tail = " ".join(" ".join(lines[lines.index(next(x for x in lines if x.startswith("checks, "))) :]).split())
    assert tail.startswith("checks, in order: driver-version, gpu-count, fm-version, fabricmanager, fabric, ")
    assert "max_temperature 85" in tail and "xid_window_s 3600" in tail and "gpu_count per node" in tail
    data = json.loads(json.dumps(failures_cmd.report_json(site, figures, judged)))
    assert data["fleet"]["mtbf_s"] == 175 * 3600 and data["node_count"] == 3
    assert [c["name"] for c in data["classes"]] == ["xid", "ecc", "slurm: Not responding"]


class Cluster3:
    """Three compute nodes (the figures above are for three)."""

    class Node:
        def __init__(self, name: str) -> None:
            self.name, self.roles = name, ["compute"]

    nodes: ClassVar[list[Node]] = [Node("nodeA"), Node("nodeB"), Node("nodeC")]
    config = SimpleNamespace(slurm=SimpleNamespace(partitions=[]))  # no spare pools


def test_cli_report(site: Site):
    shown = CliRunner().invoke(
        app, ["report", "--inventory", str(site.directory), "--days", "7"], env={"COLUMNS": "100"}
    )
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith("reliability of prod, ")
    assert "all nodes: 0 failures, MTBF - , " not in shown.stdout
    data = json.loads(CliRunner().invoke(app, ["report", "--inventory", str(site.directory), "--json"]).stdout)
    assert data["fleet"]["failures"] == 0 and data["fleet"]["availability"] == 1.0
    assert data["node_count"] == len([n for n in data["by_node"]])

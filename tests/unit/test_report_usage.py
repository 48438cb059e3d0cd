"""corectl report's usage part (issue 29): sacct's and Prometheus's answers parsed, GPU-hours by hand, the SVG
plots (bars proportional to values, every cluster text escaped), the page self-contained, the terminal form at
80 columns, and what the command refuses or says when the head cannot be read."""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import ROOT
from corectl.ansible import Returned
from corectl.cli import app
from corectl.commands import failures as failures_cmd
from corectl.health import charts, page, usage, usage_read
from corectl.health.coverage import spares_period
from corectl.site import Site, render
from corectl.site.context import Context
from corectl.slurm import SlurmStatus
from report_sample import HOSTILE, OUTAGES, QUERY_RANGE, SACCT, SINCE, UNTIL, sample_figures, sample_read


def test_sacct_lines_give_each_allocated_job_and_its_gpus():
    jobs = usage.parse_sacct(SACCT)
    assert [(j.job, j.user, j.account, j.gpus, j.elapsed_s, j.state) for j in jobs] == [
        ("101", "alice", "vision", 4, 36000, "COMPLETED"),
        ("102", "alice", "research", 1, 7200, "FAILED"),  # the typed count is not added again
        ("103", HOSTILE, "hpcadmin", 2, 9000, "RUNNING"),
        ("104", "carol", "hpcadmin", 0, 3600, "CANCELLED"),
    ]  # 105 never ran
    assert [j.gpu_hours for j in jobs] == [40.0, 2.0, 5.0, 0.0]


def test_gpu_hours_and_jobs_per_account_and_user_most_first():
    used = usage.usage(usage.parse_sacct(SACCT))
    assert [(s.name, s.jobs, s.gpu_hours) for s in used.accounts] == [
        ("vision", 1, 40.0),
        ("hpcadmin", 2, 5.0),
        ("research", 1, 2.0),
    ]
    assert [(s.name, s.jobs, s.gpu_hours) for s in used.users] == [
        ("alice", 2, 42.0),
        (HOSTILE, 1, 5.0),
        ("carol", 1, 0.0),
    ]
    assert (used.jobs, used.gpu_hours) == (4, 47.0)


@pytest.mark.parametrize(
    "text",
    ["101|alice|vision|gres/gpu=4|3600", "101|alice|vision|gres/gpu=x|3600|COMPLETED", "1|a|b|cpu=1|soon|RUNNING"],
)
def test_an_unreadable_sacct_answer_is_said_not_guessed(text: str):
    with pytest.raises(usage.UnreadableAnswer):
        usage.parse_sacct(text)


def test_the_utilisation_series_and_the_step_for_about_200_points():
    series = usage.parse_query_range(json.dumps(QUERY_RANGE))
    assert len(series.times) == 200 and series.times[0] == int(SINCE.timestamp())
    assert series.util[:1] + series.util[50:51] == [50.0, 90.0]
    assert series.busy[99:101] == [4.0, 0.0]  # no sample of a job: none in use
    assert (series.mean_util, series.peak_busy, series.most_gpus) == (70.0, 4, 16)
    assert usage.step_for(86400) == 432 and usage.step_for(30 * 86400) == 12960 and usage.step_for(10) == 1
    with pytest.raises(usage.UnreadableAnswer, match="Prometheus said error: bad query"):
        usage.parse_query_range({"status": "error", "error": "bad query"})
    with pytest.raises(usage.UnreadableAnswer):
        usage.parse_query_range("<html>proxy</html>")


def test_bars_are_proportional_to_their_values():
    svg = charts.bar_chart("GPU-hours per account", [("a", 40.0), ("b", 10.0), ("c", 0.0)], "#123456", "h")
    widths = [int(w) for w in re.findall(r'<rect x="\d+" y="\d+" width="(\d+)" height="20" fill="#123456"', svg)]
    assert widths == [550, 138, 0]  # 550 px: the plot's width, the largest value's bar


def test_outages_that_would_cover_each_other_get_lanes_of_their_own():
    """Two short drains of one node a minute apart, in a day's timeline (a pixel is two minutes), and a
    long one later: each bar is at least 2 px wide and none shares a pixel with another of its row."""
    day = SINCE

    def at(hour: int, minute: int, second: int = 0) -> datetime:
        return day.replace(hour=hour, minute=minute, second=second)

    spans = [
        charts.Span("dgx02", at(1, 0), at(1, 0, 20), "#111111", "ecc"),
        charts.Span("dgx02", at(1, 1), at(1, 1, 20), "#222222", "nvlink"),
        charts.Span("dgx02", at(1, 10), at(9, 0), "#333333", "xid"),
        charts.Span("dgx01", at(12, 0), at(18, 0), "#444444", "ib"),
    ]
    svg = charts.timeline("t", ["dgx01", "dgx02"], spans, day, day + timedelta(days=1), {})
    rects = {
        fill: (int(x), int(y), int(w))
        for x, y, w, fill in re.findall(r'<rect x="(\d+)" y="(\d+)" width="(\d+)" height="18" fill="(#\d+)"', svg)
    }
    assert set(rects) == {"#111111", "#222222", "#333333", "#444444"}
    assert all(w >= 2 for _x, _y, w in rects.values())
    for one, other in itertools.combinations(rects.values(), 2):
        if one[1] == other[1]:  # same lane: their pixels apart
            assert one[0] + one[2] <= other[0] or other[0] + other[2] <= one[0], (one, other)
    assert rects["#111111"][1] == rects["#333333"][1] != rects["#222222"][1]  # the long one fits after the first
    assert rects["#444444"][1] < rects["#111111"][1]  # dgx01's row above


def test_every_text_from_the_cluster_is_escaped():
    html = page.report_page("lab", sample_figures(), OUTAGES, sample_read(), UNTIL)
    assert HOSTILE not in html and "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    hostile_outage = [OUTAGES[0].__class__("x<y>", SINCE, UNTIL, True, '<b onclick="x">', "</title><svg onload=1>")]
    svg = page.report_page("lab", sample_figures(), hostile_outage, sample_read(), UNTIL)
    assert "<svg onload" not in svg and "<b onclick" not in svg and "x<y>" not in svg


def test_the_page_is_self_contained():
    html = page.report_page("lab", sample_figures(), OUTAGES, sample_read(), UNTIL)
    assert not re.search(r"\b(src|href)=|url\(|@import|<script|<link", html)
    assert html.count("<svg") == 5  # GPU-hours per account and per user, utilisation, GPUs in use, the timeline


def test_the_page_says_what_could_not_be_read():
    read = usage.UsageRead(
        None, None, "usage not read: head01 unreachable: ssh", "utilisation: the site has no Prometheus"
    )
    html = page.report_page("lab", sample_figures(), [], read, UNTIL)
    assert "usage not read: head01 unreachable: ssh" in html and "the site has no Prometheus" in html
    assert "no node out of service in the period" in html


def test_what_the_head_answered_or_why_not():
    sacct = Returned(usage_read.SACCT, lambda _e: None)
    sacct.unreachable["head01"] = "unreachable: Failed to connect to the host via ssh"
    assert usage_read.usage_from("head01", sacct) == (
        None,
        "usage not read: head01 unreachable: Failed to connect to the host via ssh",
    )
    sacct.by_host["head01"] = {"rc": 0, "stdout": SACCT}
    assert usage_read.usage_from("head01", sacct)[0] == sample_read().usage
    prometheus = Returned(usage_read.PROMETHEUS, lambda _e: None)
    prometheus.by_host["head01"] = {"failed": True, "msg": "Status code was -1: Connection refused"}
    assert usage_read.utilisation_from("head01", prometheus) == (
        None,
        "utilisation not read: head01: Status code was -1: Connection refused",
    )
    prometheus.by_host["head01"] = {"json": QUERY_RANGE, "status": 200}
    assert usage_read.utilisation_from("head01", prometheus)[0] == sample_read().utilisation
    extra = usage_read.extravars(SINCE, UNTIL)
    assert (extra["corectl_report_start"], extra["corectl_report_end"]) == (
        "2026-11-01T00:00:00",
        "2026-11-02T00:00:00",
    )
    assert extra["corectl_report_step"] == 432 and 'hpc_job!=""' in extra["corectl_report_query"]


def test_the_terminal_form_fits_80_columns():
    of = failures_cmd.Period(OUTAGES, sample_read())
    site = Site(root=ROOT, directory=Path("/nonexistent/lab"))
    judged = {"checks": ["xid", "ecc"], "thresholds": {"node_health_max_temperature": 85}}
    console = Console(record=True, width=80, color_system=None, file=StringIO())
    console.print(failures_cmd.report_view(site, sample_figures(), judged, of))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = " ".join(" ".join(lines).split())  # rich wraps a long line at 80 columns
    assert "usage: 4 jobs, 47.00 GPU-hours" in text
    assert "utilisation: mean GPU utilisation 70.0% (200 samples), at most 4 of 16 GPUs in use" in text
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert ["vision", "1", "40.00"] in cells and ["alice", "2", "42.00"] in cells
    assert ["dgx01", "2026-11-01 00:00:00Z"[:11] + "02:00:00Z", "6.00 h", "xid"] in cells
    data = failures_cmd.report_json(site, sample_figures(), judged, of)
    assert data["usage"]["users"][0] == {"name": "alice", "jobs": 2, "gpu_hours": 42.0}
    assert len(data["utilisation"]["times"]) == 200 and data["out_of_service"][1]["still"] is True


@pytest.fixture
def site(prod_copy: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    monkeypatch.setattr(failures_cmd, "read_slurm_status", lambda ctx, event_days: SlurmStatus())
    monkeypatch.setattr(failures_cmd, "read_usage", lambda ctx, since, until: sample_read())
    return Site(root=ROOT, directory=prod_copy)


def test_report_html_writes_the_page_and_refuses_bad_input(site: Site, tmp_path: Path):
    target = tmp_path / "report.html"
    done = CliRunner().invoke(app, ["report", "--inventory", str(site.directory), "--days", "1", "--html", str(target)])
    assert done.exit_code == 0, done.output
    assert f"report written to {target}" in done.stdout
    assert target.read_text().startswith("<!DOCTYPE html>") and "GPU-hours per account" in target.read_text()
    for argv, said in (
        (["--days", "0"], "--days"),
        (["--html", str(tmp_path / "missing" / "r.html")], "is not a writable directory"),
        (["--html", str(tmp_path)], "a directory"),
    ):
        done = CliRunner().invoke(app, ["report", "--inventory", str(site.directory), *argv])
        assert done.exit_code == 2 and said in done.output and "Traceback" not in done.output, done.output


def test_an_unreachable_head_is_one_line_per_part_and_the_run_asks_both_hosts(prod_copy: Path, monkeypatch):
    from corectl.site.loader import load_cluster

    cluster = load_cluster(prod_copy)
    render.write(cluster, prod_copy)  # a read runs with the inventory as last rendered
    head = cluster.with_role("slurm_controller")[0].name
    asked = []

    def run(request, sink, cluster):
        asked.append((request.playbook, request.limit, request.secrets, request.fan_out))
        sink({"event": "runner_on_unreachable", "event_data": {"host": head, "res": {"msg": "ssh: timed out\nmore"}}})

    monkeypatch.setattr(usage_read.ansible, "run", run)
    read = usage_read.read_usage(Context(Site(root=ROOT, directory=prod_copy), writes=False), SINCE, UNTIL)
    assert asked == [("report.yml", head, False, False)]  # the head is the controller and the monitoring node
    assert (read.usage, read.utilisation) == (None, None)
    assert read.usage_note == f"usage not read: {head} unreachable: ssh: timed out"
    assert read.utilisation_note == f"utilisation not read: {head} unreachable: ssh: timed out"


def test_the_page_shows_each_failure_with_its_spare_and_the_capacity():
    swap = (int((SINCE + timedelta(hours=2, seconds=20)).timestamp()), "batch", "swap", "dgx03", "dgx01", "...")
    spares = spares_period(OUTAGES, [swap], computes=3, pool=1, since=SINCE, until=UNTIL)
    html = page.report_page("lab", sample_figures(), OUTAGES, sample_read(), UNTIL, spares)
    assert "<h2>Spares and capacity</h2>" in html
    # (no "held as spare" event after dgx01's repair in this sample: dgx03 still counts in use at the end)
    assert "capacity: 2 of 2 declared nodes in service at the end; lowest 1 (2026-11-01 02:00:00Z)" in html
    assert "<td>dgx01</td><td>2026-11-01 02:00:00Z</td><td>dgx03</td><td class=n>0.01 h</td>" in html
    assert "<td>dgx02</td><td>2026-11-01 12:00:00Z</td><td>none</td><td class=n>-</td>" in html  # no spare
    assert "Spares and capacity" not in page.report_page("lab", sample_figures(), OUTAGES, sample_read(), UNTIL)

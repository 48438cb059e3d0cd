"""corectl health: aggregation and formatting of per-node checker results (no Ansible, no nodes)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import returned
from corectl.ansible.events import HostStats, RunRequest, RunResult
from corectl.cli import app
from corectl.health import report as health_mod
from corectl.health.report import (
    RETURNED,
    check_columns,
    collect,
    health_json,
    health_table,
    normalize,
    render_report,
    report_from_result,
)


def report(node: str, **statuses: str | tuple[str, str]) -> dict[str, Any]:
    checks = []
    for name, value in statuses.items():
        status, message = value if isinstance(value, tuple) else (value, f"{name} {value}")
        checks.append({"name": name.replace("_", "-"), "status": status, "message": message})
    return {"node": node, "ok": all(c["status"] != "fail" for c in checks), "checks": checks}


def text_of(renderable: object, width: int = 200) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


HEALTHY = report("dgx01", driver_version="pass", gpu_count="pass", ecc="pass", dcgm_diag="skip")
LOST_GPU = report(
    "dgx02",
    driver_version="pass",
    gpu_count=("fail", "7 of 8 GPUs visible to nvidia-smi"),
    ecc="pass",
    dcgm_diag="skip",
)


def test_normalize_recomputes_ok_and_cleans_up():
    data = {
        "node": "x",
        "ok": True,  # wrong: a check failed
        "checks": [
            {"name": "ecc", "status": "fail", "message": "GPU 0:\n 1 error"},
            {"name": "xid", "status": "weird", "message": "?"},
            {"status": "pass"},  # no name: dropped
        ],
    }
    normalized = normalize("dgx01", data)
    assert normalized["node"] == "dgx01"
    assert normalized["ok"] is False
    assert normalized["checks"] == [
        {"name": "ecc", "status": "fail", "message": "GPU 0: 1 error"},
        {"name": "xid", "status": "fail", "message": "?"},
    ]
    assert normalize("dgx01", {"checks": []})["checks"][0]["name"] == "checker"
    assert normalize("dgx01", "garbage")["ok"] is False


def test_a_report_comes_from_the_check_tasks_result():
    """What playbooks/health.yml hands back of its check (command module results)."""
    assert report_from_result("dgx01", {"rc": 0, "stdout": json.dumps(HEALTHY)})["ok"] is True
    assert report_from_result("dgx02", {"rc": 1, "stdout": json.dumps(LOST_GPU)})["ok"] is False
    broken = report_from_result("dgx03", {"rc": 0, "stdout": "{not json"})
    assert broken["checks"][0]["name"] == "checker"
    assert broken["checks"][0]["message"].startswith("unreadable result")
    missing = {"rc": 2, "stdout": "", "stderr": "", "msg": "Error executing command.",
               "cmd": "/usr/local/sbin/corectl-health-check --json"}  # fmt: skip
    assert report_from_result("dgx04", missing)["checks"][0]["message"] == (
        "cannot execute /usr/local/sbin/corectl-health-check (not installed? run: corectl provision --tags health)"
    )
    crashed = {"rc": 3, "stdout": "", "stderr": "Traceback ...\nKeyError: 'gpus'", "msg": "non-zero return code",
               "cmd": ["/opt/check", "--json"]}  # fmt: skip
    assert report_from_result("dgx05", crashed)["checks"][0]["message"] == "check failed (rc 3): KeyError: 'gpus'"


def test_collect_marks_unreachable_and_silent_nodes():
    hosts = {
        "dgx01": HostStats(ok=2),
        "dgx03": HostStats(unreachable=1),
        "dgx04": HostStats(failed=1),
    }
    merged = collect({"dgx01": HEALTHY}, hosts, {"dgx03": "unreachable: ssh: connect to host port 22: refused"})
    assert list(merged) == ["dgx01", "dgx03", "dgx04"]
    assert merged["dgx01"] is HEALTHY
    assert merged["dgx03"]["checks"] == [
        {"name": "reachable", "status": "fail", "message": "unreachable: ssh: connect to host port 22: refused"}
    ]
    assert merged["dgx04"]["checks"][0]["name"] == "reachable"
    assert merged["dgx04"]["ok"] is False
    assert collect({}, {"dgx05": HostStats(unreachable=1)})["dgx05"]["checks"][0]["message"] == "unreachable over SSH"


def test_columns_follow_the_checker_order_and_hide_checks_skipped_everywhere():
    unreachable = {"node": "dgx03", "ok": False, "checks": [{"name": "reachable", "status": "fail", "message": "x"}]}
    columns, skipped = check_columns({"dgx01": HEALTHY, "dgx02": LOST_GPU, "dgx03": unreachable})
    assert columns == ["reachable", "driver-version", "gpu-count", "ecc"]
    assert skipped == ["dcgm-diag"]


def test_table_highlights_failures_with_footnotes():
    reports = {"dgx01": HEALTHY, "dgx02": LOST_GPU}
    table, notes = health_table(reports)
    assert notes == ["[1] dgx02 gpu-count: 7 of 8 GPUs visible to nvidia-smi", "skipped on every node: dcgm-diag"]
    assert table.title == "health: 2 nodes checked, 1 passed, 1 failed"
    cells = {column.header: list(column.cells) for column in table.columns}
    assert [str(c) for c in cells["gpu-count"]] == ["ok", "FAIL [1]"]
    assert cells["gpu-count"][1].style == "bold red"
    assert cells["node"][1].style == "bold red"
    text = text_of(render_report(reports, wide=True))
    lines = text.splitlines()
    assert any(line.replace("│", " ").split()[:4] == ["dgx02", "ok", "FAIL", "[1]"] for line in lines), text
    assert "[1] dgx02 gpu-count: 7 of 8 GPUs visible to nvidia-smi" in text


def test_default_report_lists_only_the_failing_nodes():
    text = text_of(render_report({"dgx01": HEALTHY, "dgx02": LOST_GPU}))
    assert text.splitlines() == [
        "health: 2 nodes checked, 1 passed, 1 failed (skipped: dcgm-diag)",
        "dgx02  gpu-count: 7 of 8 GPUs visible to nvidia-smi",
    ]


def test_all_passing_is_one_summary_line():
    text = text_of(render_report({"dgx01": HEALTHY, "dgx03": report("dgx03", ecc="pass")}), width=80)
    assert text.splitlines() == ["health: 2 nodes checked, 2 passed, 0 failed (skipped: dcgm-diag)"]
    one = text_of(render_report({"dgx03": report("dgx03", ecc="pass")}))
    assert one == "health: 1 node checked, 1 passed, 0 failed\n"


def test_long_messages_are_shortened_but_the_node_and_check_stay_whole():
    long_name = "corectl-labtest-e2e-dgx01"
    broken = report(long_name, driver_version=("fail", "word " * 200))
    lines = text_of(render_report({long_name: broken}), width=80).splitlines()
    assert lines[1].split()[:2] == [long_name, "driver-version:"]
    assert lines[-1].rstrip().endswith("…")
    assert len(lines) < 8  # 1,000 characters of message cut to MESSAGE_LIMIT
    assert all(len(line) <= 80 for line in lines)


def thousand_nodes() -> dict[str, dict[str, Any]]:
    """999 healthy dgxNNNN nodes and a long-named one; 3 fail, each on different checks."""
    passing = {"driver_version": "pass", "gpu_count": "pass", "ecc": "pass", "xid": "pass", "dcgm_diag": "skip"}
    reports = {f"dgx{i:04d}": report(f"dgx{i:04d}", **passing) for i in range(1, 1000)}
    reports["dgx0007"] = report(
        "dgx0007",
        **{
            **passing,
            "ecc": ("fail", "GPU 3: 2 uncorrectable volatile ECC errors, 1 retired page pending; reset the GPU"),
            "xid": ("fail", "Xid 79 on GPU 3 (fallen off the bus)"),
        },
    )
    reports["dgx0512"] = report("dgx0512", **{**passing, "gpu_count": ("fail", "7 of 8 GPUs visible to nvidia-smi")})
    reports["corectl-labtest-e2e-dgx01"] = report(
        "corectl-labtest-e2e-dgx01",
        reachable=("fail", "unreachable: ssh: connect to host 10.0.1.77 port 22: No route to host"),
    )
    return dict(sorted(reports.items()))


FAILING = {"dgx0007": ["ecc", "xid"], "dgx0512": ["gpu-count"], "corectl-labtest-e2e-dgx01": ["reachable"]}


def test_a_thousand_nodes_at_80_columns():
    reports = thousand_nodes()
    assert len(reports) == 1000
    lines = text_of(render_report(reports), width=80).splitlines()
    assert lines[0] == "health: 1,000 nodes checked, 997 passed, 3 failed (skipped: dcgm-diag)"
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) < 20, lines  # the 997 passing nodes are not listed
    starts = {line.split()[0]: line for line in lines[1:] if line and not line[0].isspace()}
    assert set(starts) == set(FAILING)  # each failing node once, whole, at the start of its line
    for node, checks in FAILING.items():
        assert starts[node].split()[1] == f"{checks[0]}:", starts[node]
        for check in checks:
            assert any(f"{check}:" in line.split() for line in lines), check
    assert "Xid 79 on GPU 3" in " ".join(line.strip() for line in lines)
    assert not any(line.startswith("dgx0001") for line in lines)


def test_a_thousand_nodes_wide_is_the_matrix():
    lines = text_of(render_report(thousand_nodes(), wide=True)).splitlines()
    assert len(lines) > 1000  # one row per node
    assert any(line.replace("│", " ").split()[:2] == ["dgx0001", "ok"] for line in lines)


def test_json_shape():
    assert health_json({"dgx01": HEALTHY}) == {"nodes": {"dgx01": HEALTHY}, "ok": True}
    assert health_json({"dgx01": HEALTHY, "dgx02": LOST_GPU})["ok"] is False
    assert health_json({})["ok"] is False  # no node answered: not healthy


# --------------------------------------------------------------------------- the command, with Ansible faked


def check_event(host: str, report: dict[str, Any], rc: int) -> dict[str, Any]:
    """What playbooks/health.yml hands back for ``host``, its checker having said ``report``."""
    res = {"rc": rc, "stdout": json.dumps(report), "stderr": "", "cmd": ["/usr/local/sbin/corectl-health-check"]}
    return returned(RETURNED, host, res)


@pytest.fixture
def fake_run(monkeypatch: pytest.MonkeyPatch) -> list[RunRequest]:
    """The run replaced: dgx01 healthy, dgx02 lost a GPU, dgx03 unreachable."""
    seen: list[RunRequest] = []

    def run_site(request: RunRequest, sink: Any = None, **_: Any) -> RunResult:
        seen.append(request)
        sink(check_event("dgx01", HEALTHY, rc=0))
        sink(check_event("dgx02", LOST_GPU, rc=1))
        sink({"event": "runner_on_unreachable", "event_data": {"host": "dgx03", "res": {"msg": "no route"}}})
        hosts = {"dgx01": HostStats(ok=1), "dgx02": HostStats(ok=1), "dgx03": HostStats(unreachable=1)}
        return RunResult("successful", 0, hosts, Path("/nonexistent/run"), 1.0)

    monkeypatch.setattr(health_mod.ansible, "run", run_site)
    return seen


def test_cli_health_json(prod_copy: Path, fake_run: list[RunRequest]):
    result = CliRunner().invoke(app, ["health", "--inventory", str(prod_copy), "--json", "--level", "2"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert sorted(data["nodes"]) == ["dgx01", "dgx02", "dgx03"]
    assert data["nodes"]["dgx03"]["checks"] == [
        {"name": "reachable", "status": "fail", "message": "unreachable: no route"}
    ]
    request = fake_run[0]
    assert request.playbook == "health.yml"
    assert request.extravars["corectl_health_level"] == 2
    assert request.secrets is False


def test_cli_health_table(prod_copy: Path, fake_run: list[RunRequest]):
    result = CliRunner().invoke(app, ["health", "--inventory", str(prod_copy), "--limit", "dgx0[1-3]"])
    assert result.exit_code == 1, result.output
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert "health: 3 nodes checked, 1 passed, 2 failed (skipped: dcgm-diag)" in lines
    assert "dgx02  gpu-count: 7 of 8 GPUs visible to nvidia-smi" in lines
    assert "dgx03  reachable: unreachable: no route" in lines
    assert not any(line.startswith("dgx01") for line in lines)
    assert fake_run[0].limit == "dgx0[1-3]"
    assert "corectl_health_level" not in fake_run[0].extravars


def test_cli_health_rejects_a_bad_level(prod_copy: Path, fake_run: list[RunRequest]):
    result = CliRunner().invoke(app, ["health", "--inventory", str(prod_copy), "--level", "4"])
    assert result.exit_code == 2
    assert not fake_run

"""Logs in one place (issue 29): the log host's reader (role logs' corectl-logs) over a node's current and rotated
files, and what `corectl logs` refuses before anything runs. The lab's end-to-end test forwards real journals."""

from __future__ import annotations

import datetime
import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT

READER = ROOT / "roles" / "logs" / "files" / "corectl-logs"


def stamp(seconds_ago: float) -> str:
    when = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return when.isoformat(timespec="microseconds")


def read(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(READER), "--dir", str(directory), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    """dgx01's logs as the log host keeps them: two rotated files (one compressed) and the current one."""
    (tmp_path / "dgx01.log.2.gz").write_bytes(gzip.compress(f"{stamp(3 * 86400)} dgx01 kernel: oldest\n".encode()))
    (tmp_path / "dgx01.log.1").write_text(f"{stamp(86400)} dgx01 slurmd[812]: yesterday\n")
    (tmp_path / "dgx01.log").write_text(
        f"{stamp(7200)} dgx01 kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
        f"{stamp(60)} dgx01 corectl-heal: power cycle\n"
    )
    (tmp_path / "dgx011.log").write_text(f"{stamp(5)} dgx011 another node\n")
    return tmp_path


def test_the_reader_gives_a_nodes_lines_oldest_first_across_rotations(kept: Path):
    out = read(kept, "dgx01").stdout.splitlines()
    assert [line.split(" ", 2)[2] for line in out] == [
        "kernel: oldest",
        "slurmd[812]: yesterday",
        "kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        "corectl-heal: power cycle",
    ]


def test_since_grep_and_lines_narrow_what_is_read(kept: Path):
    assert [line.split(" ", 2)[2] for line in read(kept, "dgx01", "--since", "10800").stdout.splitlines()] == [
        "kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        "corectl-heal: power cycle",
    ]
    assert read(kept, "dgx01", "--grep", "Xid .*: 79").stdout.count("\n") == 1
    assert read(kept, "dgx01", "--lines", "1").stdout.strip().endswith("corectl-heal: power cycle")
    assert read(kept, "dgx01", "--lines", "0").stdout.count("\n") == 4


def test_the_reader_refuses_what_is_not_a_node_and_says_when_it_holds_nothing(kept: Path):
    missing = read(kept, "dgx99")
    assert (missing.returncode, missing.stderr.strip()) == (1, f"corectl-logs: no logs of dgx99 in {kept}")
    escape = read(kept, "../../etc/passwd")
    assert (escape.returncode, escape.stderr.strip()) == (2, "corectl-logs: not a node name: '../../etc/passwd'")
    pattern = read(kept, "dgx01", "--grep", "(")
    assert pattern.returncode == 2 and pattern.stderr.startswith("corectl-logs: --grep '(': ")


def test_corectl_logs_refuses_bad_input_before_anything_runs(tmp_path: Path):
    from corectl.cli import app
    from corectl.commands.logs import since_seconds

    assert [since_seconds(t) for t in ("90s", "30m", "2h", "7d")] == [90, 1800, 7200, 604800]
    result = CliRunner().invoke(app, ["logs", "dgx01", "--inventory", "prod", "--since", "yesterday"])
    assert result.exit_code == 2
    assert "--since 'yesterday': a number and a unit, s m h or d (e.g. 30m, 2h, 7d)" in result.output
    result = CliRunner().invoke(app, ["logs", "dgx99", "--inventory", "prod"])
    assert result.exit_code == 2 and "dgx99 is not a node of prod" in result.output

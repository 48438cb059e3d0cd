"""corectl runs: past runs from the records each run leaves."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from corectl.commands.history import load_runs, runs_table
from corectl.site import Site


def test_runs_are_listed_oldest_first_and_broken_records_skipped(tmp_path: Path, root: Path):
    site = Site(root=root, directory=tmp_path / "site")
    for ident, started, status, hosts in [
        ("b", "2026-11-21T10:05:00+00:00", "failed", {"dgx01": {"failed": 1}, "head01": {"changed": 0}}),
        ("a", "2026-11-21T10:00:00+00:00", "successful", {"dgx01": {"changed": 3}}),
    ]:
        (site.runs_dir / ident).mkdir(parents=True)
        record = {"command": "provision", "started": started, "status": status, "hosts": hosts, "elapsed_s": 1.0}
        (site.runs_dir / ident / "corectl.json").write_text(json.dumps(record))
    (site.runs_dir / "c").mkdir()
    (site.runs_dir / "c" / "corectl.json").write_text("{truncated")
    records = load_runs(site)
    assert [r["id"] for r in records] == ["a", "b"]
    console = Console(width=200, record=True)
    console.print(runs_table(site, 10))
    text = console.export_text()
    assert "2026-11-21 10:00:00" in text and "1: dgx01" in text
    assert text.index("│ successful") < text.index("│ failed")

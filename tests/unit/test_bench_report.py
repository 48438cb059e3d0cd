"""bench/fleet.py's report: the projection from the no-op's CPU slope, and the table it writes
into docs/performance.md (only between the markers, and only for a run of every part)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import fleet


def noop_rows() -> list[dict]:
    """Controller CPU grows by 5, 3, 2, 1 and 0.2 CPU-seconds per DGX for stock, corectl, mitogen, runners and
    node-local; corectl's own process by 0.05 of node-local's."""
    per = {"stock": 5.0, "corectl": 3.0, "mitogen": 2.0, "runners": 1.0, "nodelocal": 0.2}
    rows = [
        {"dgx": dgx, **{v: {"wall_s": 10.0 + 2 * k * dgx, "cpu_s": 4.0 + k * dgx} for v, k in per.items()}}
        for dgx in (1, 2, 4, 8)
    ]
    for row in rows:
        row["nodelocal"] |= {"corectl_cpu_s": 1.0 + 0.05 * row["dgx"], "services_s": 60.0, "node_job_s": 40.0}
        row["floor"] = {"wall_s": 2.0, "cpu_s": 1.5}
    return rows


def test_projection_is_the_cpu_slope_times_the_node_count():
    lines = fleet.projection(noop_rows())
    mitogen = next(line for line in lines if line.strip().startswith("mitogen"))
    # 2 CPU-s per DGX: 128 nodes 256 s (4 min), 1,024 nodes 2,048 s (34 min), 12,288 nodes 6.8 h
    assert mitogen.split()[1:3] == ["2.00", "CPU-s"]
    assert "4 min" in mitogen and "34 min" in mitogen and "6.8 h" in mitogen
    stock = next(line for line in lines if line.strip().startswith("stock"))
    assert stock.split()[1] == "5.00"
    # node-local's wall time: 60 s of services, then 40 s per round of 32 nodes (or one round of all), unless the
    # control host is slower. 1,024 nodes: 60 + 32 x 40 = 1,340 s (22 min) | 100 s, more than 1,024 x 0.05 = 51 s
    # on corectl's one core. 12,288 nodes: 60 + 384 x 40 = 15,420 s (4.3 h) | 12,288 x 0.05 = 614 s (10 min) on
    # corectl's one core, more than 100 s of jobs and 12,288 x 0.2 / 16 = 154 s of all its CPU over 16 cores
    wall = {line.split(":")[0].strip(): line.split(":", 1)[1].strip() for line in lines if " nodes: " in line}
    assert wall["1,024 nodes"] == "22 min (bound by node jobs) | 100 s (bound by node jobs)"
    assert wall["12,288 nodes"] == "4.3 h (bound by node jobs) | 10 min (bound by corectl's one core)"


def test_report_shows_every_figure_of_a_full_run():
    results = {
        "render": [{"nodes": 13, "render_s": 0.01, "peak_rss_mb": 40.0, "per_node_ratio": 1.0},
                   {"nodes": 10000, "render_s": 0.9, "peak_rss_mb": 76.0, "per_node_ratio": 0.07,
                    "ansible_inventory_s": 11.5, "ansible_inventory_rss_mb": 471.0,
                    "ansible_inventory_export_s": 3.5}],
        "full": {"dgx": 2, "wall_s": 133.2, "cpu_s": 28.1, "slowest": [[15.2, "slurm: Install MariaDB"]]},
        "noop": noop_rows(),
        "addnode": [{"node": "b-dgx02", "existing_dgx": 1, "wall_s": 93.0, "hosts_changed": ["b-dgx02"]},
                    {"node": "b-dgx05", "existing_dgx": 4, "wall_s": 95.0, "hosts_changed": ["b-dgx05"]}],
    }  # fmt: skip
    text = fleet.report(results)
    assert "fresh lab (head + 2 DGX): 133.2 s wall" in text
    assert "ansible-inventory --list 11.50 s" in text and "--export 3.50 s" in text
    assert "head + 8 DGX" in text
    assert "mitogen: 4.0 s wall per added DGX" in text
    assert "add-node wall-time ratio (4 vs 1 existing DGX): 1.02" in text
    assert "12,288 nodes" in text


def test_the_table_goes_between_the_markers_and_nowhere_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    doc = tmp_path / "performance.md"
    doc.write_text(f"# before\n\n{fleet.DOC_BEGIN}\nold table\n{fleet.DOC_END}\n\n# after\n")
    monkeypatch.setattr(fleet, "DOC", doc)
    assert fleet.write_doc("NEW TABLE", ["--sizes", "1,2"])
    text = doc.read_text()
    assert "old table" not in text
    assert text.startswith("# before\n\n") and text.endswith(f"{fleet.DOC_END}\n\n# after\n")
    assert 'Written by `make bench BENCH_ARGS="--sizes 1,2"`' in text and "NEW TABLE" in text
    doc.write_text("# no markers\n")
    assert not fleet.write_doc("NEW TABLE", [])
    assert doc.read_text() == "# no markers\n"


def test_each_variant_is_set_against_the_ssh_floor_measured_beside_it():
    rows = noop_rows()
    del rows[0]["floor"]  # a results file from before the floor was measured: that size has no line
    lines = fleet.floor_lines(rows)
    assert len(lines) == 3
    # head + 8 DGX: corectl's wall 10 + 2 x 3 x 8 = 58 s against a 2 s floor; stock's 10 + 2 x 5 x 8 = 90 s
    last = lines[-1]
    assert last.startswith("  head + 8 DGX wall vs the SSH floor (2.00 s, ansible all -m ping):")
    assert "corectl x29.0" in last and "stock x45.0" in last
    assert last in fleet.report({"noop": rows})

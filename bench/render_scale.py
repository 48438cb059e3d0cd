"""How validation and rendering scale with cluster size.

Generates cluster.yml files of growing size (DGX ranges of 12 nodes per leaf switch, like
inventories/prod) and times load_cluster + render_text on each, in this process, against the
13-node prod site as the baseline. Prints per-node cost ratios: ~1.0 means linear scaling.

    .venv/bin/python bench/render_scale.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import yaml

from corectl.site.loader import load_cluster
from corectl.site.render import render_text

ROOT = Path(__file__).resolve().parents[1]
SIZES = (12, 120, 1200, 4800)
REPEAT = 3


def site_with(dgx: int, directory: Path) -> Path:
    data = yaml.safe_load((ROOT / "inventories" / "prod" / "cluster.yml").read_text())
    leaves = (dgx + 11) // 12
    data["nodes"] = [data["nodes"][0]] + [
        {
            "name": f"dgx[{i * 12 + 1:04d}-{min(dgx, i * 12 + 12):04d}]",
            "address": f"10.{20 + (i * 12) // 250}.{(i * 12) % 250}.1",
            "profile": "dgx-h100",
            "roles": ["compute"],
            "rack": f"r{i:03d}",
            "leaf": f"leaf{i:03d}",
        }
        for i in range(leaves)
    ]
    data["fabric"]["switches"] = [{"name": f"leaf{i:03d}"} for i in range(leaves)] + [
        {"name": "spine1", "switches": [f"leaf{i:03d}" for i in range(leaves)]}
    ]
    data["slurm"]["partitions"] = [{"name": "batch", "nodes": f"dgx[0001-{dgx:04d}]", "default": True}]
    site = directory / f"site{dgx}"
    site.mkdir()
    (site / "cluster.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    return site


def timed(site: Path) -> float:
    samples = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        render_text(load_cluster(site))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    baseline_site = ROOT / "inventories" / "prod"
    base = timed(baseline_site) / 13
    print(f"baseline: prod site, 13 nodes, {base * 1e3:.3f} ms per node (validate + render)")
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            site = site_with(size, Path(tmp))
            per_node = timed(site) / (size + 1)
            print(f"{size + 1:5d} nodes: {per_node * 1e3:.3f} ms per node, ratio to baseline {per_node / base:5.2f}")


if __name__ == "__main__":
    main()

"""corectl's Grafana dashboards (dashboards/build.py, Grafana's foundation SDK): the JSON role monitoring ships is
what the code builds, byte for byte, every time; every panel queries the site's Prometheus data source and names in
its legend only labels its query keeps. (The lab e2e runs each query against a live Prometheus.)"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "roles" / "monitoring" / "files" / "dashboards"
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
BY = re.compile(r"\bby \(([^)]*)\)")


def build_module():
    spec = importlib.util.spec_from_file_location("corectl_dashboards", ROOT / "dashboards" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_shipped_dashboards_are_what_the_code_builds_every_time():
    build = build_module()
    first, second = build.render(), build.render()
    assert first == second
    assert sorted(first) == sorted(p.name for p in SHIPPED.glob("*.json")) == [
        "cluster.json", "jobs.json", "node.json", "teams.json",
    ]  # fmt: skip
    for name, text in first.items():
        assert (SHIPPED / name).read_text() == text, f"{name}: run python dashboards/build.py"


def test_every_panel_queries_the_sites_prometheus_and_its_legend_names_labels_the_query_keeps():
    uids = set()
    for path in sorted(SHIPPED.glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] not in uids
        uids.add(board["uid"])
        titles = [panel["title"] for panel in board["panels"]]
        assert len(titles) == len(set(titles)), path.name
        for panel in board["panels"]:
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == {"type": "prometheus", "uid": "corectl-prometheus"}
                expr = target["expr"]
                grouped = BY.findall(expr)
                if grouped:  # an aggregation keeps only its by () labels: the legend may name no other
                    outer = {label.strip() for label in grouped[0].split(",")}
                    assert set(LEGEND_LABEL.findall(target["legendFormat"])) <= outer, (panel["title"], expr)
        for variable in board["templating"].get("list", []):
            assert variable["datasource"]["uid"] == "corectl-prometheus"
            assert variable["query"].startswith("label_values(")

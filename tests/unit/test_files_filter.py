"""corectl.fleet.files_under: a role directory's files as entries of one corectl.fleet.files call."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT

PLUGIN = ROOT / "collections/ansible_collections/corectl/fleet/plugins/filter/files.py"
spec = importlib.util.spec_from_file_location("corectl_files_filter", PLUGIN)
assert spec and spec.loader
files_filter = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files_filter)


def test_one_entry_per_file_in_name_order_under_the_directory():
    entries = files_filter.files_under(
        ["/r/files/dashboards/node.json", "/r/files/dashboards/cluster.json"], "/var/lib/dash", mode="0644"
    )
    assert entries == [
        {"path": "/var/lib/dash/cluster.json", "src": "/r/files/dashboards/cluster.json", "mode": "0644"},
        {"path": "/var/lib/dash/node.json", "src": "/r/files/dashboards/node.json", "mode": "0644"},
    ]
    assert files_filter.files_under([], "/var/lib/dash") == []


def test_a_relative_directory_or_an_unknown_key_is_refused():
    with pytest.raises(ValueError, match="'dash' is not an absolute path"):
        files_filter.files_under(["/r/a.json"], "dash")
    with pytest.raises(ValueError, match="unknown keys recurse"):
        files_filter.files_under(["/r/a.json"], "/d", recurse=True)

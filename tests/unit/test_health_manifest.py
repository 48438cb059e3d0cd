"""The health checker's manifest (`corectl-health-check --list --json`) is the one statement of
its checks and settings: the role's defaults, argument spec and settings template, and corectl's
health command, are held against it, so a setting or check added in one place only fails here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing

import pytest
import yaml

from conftest import CHECKER, ROOT
from corectl.health.report import CHECK_ORDER
from corectl.site.model_services import POSITIVE_THRESHOLDS, HealthThreshold

ROLE = ROOT / "roles" / "node_health"
# the role's own variables, which are not checker settings: where things go, and Slurm's hook
# (and the package for the NVMe SMART logs, and cluster.yml's thresholds over the settings)
ROLE_ONLY = {"program", "config", "check_dir", "slurm_dcgm_diag_level", "nvme_package", "thresholds"}
# a manifest type -> the argument spec types its variable may have (a path is a string)
SPEC_TYPES = {
    "int": {"int"},
    "str": {"str", "path"},
    "bool": {"bool"},
    "list": {"list"},
    "dict": {"dict"},
    "list|str": {"raw"},
}


@pytest.fixture(scope="module")
def manifest() -> dict:
    done = subprocess.run(
        [sys.executable, str(CHECKER), "--list", "--json"], capture_output=True, text=True, timeout=30, check=True
    )
    return json.loads(done.stdout)


def role_vars(document: dict) -> set[str]:
    return {key.removeprefix("node_health_") for key in document}


def test_every_setting_is_read_by_one_check_or_is_general(manifest: dict):
    owners: dict[str, list[str]] = {key: [] for key in manifest["settings"]}
    for check in manifest["checks"]:
        for key in check["settings"]:
            owners.setdefault(key, []).append(check["name"])
    for key in manifest["general_settings"]:
        owners.setdefault(key, []).append("(general)")
    assert {key: names for key, names in owners.items() if len(names) != 1} == {}


def test_the_checks_are_those_corectl_health_orders(manifest: dict):
    assert CHECK_ORDER[:2] == ("reachable", "checker")  # corectl's own: the node answered, the checker ran
    assert list(CHECK_ORDER[2:]) == [check["name"] for check in manifest["checks"]]
    listed = subprocess.run([sys.executable, str(CHECKER), "--list"], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == list(CHECK_ORDER[2:])


def test_the_role_defaults_hold_every_setting_and_nothing_else(manifest: dict):
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert role_vars(defaults) - ROLE_ONLY == set(manifest["settings"])


def test_the_argument_spec_types_every_setting_as_the_checker_does(manifest: dict):
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert role_vars(spec) - ROLE_ONLY == set(manifest["settings"])
    wrong = {
        key: (spec[f"node_health_{key}"]["type"], setting["type"])
        for key, setting in manifest["settings"].items()
        if spec[f"node_health_{key}"]["type"] not in SPEC_TYPES[setting["type"]]
    }
    assert wrong == {}


def test_the_settings_template_writes_every_setting(manifest: dict):
    template = (ROLE / "templates" / "health.json.j2").read_text()
    written = dict(re.findall(r'^\s*"([a-z_]+)": node_health_([a-z_]+)\b', template, flags=re.M))
    assert set(written) == set(manifest["settings"])
    assert {key: var for key, var in written.items() if key != var} == {}


def test_cluster_yml_thresholds_are_whole_number_settings_of_the_checker(manifest: dict):
    names = set(typing.get_args(HealthThreshold))
    assert {name: manifest["settings"].get(name, {}).get("type") for name in names} == dict.fromkeys(names, "int")
    assert names >= POSITIVE_THRESHOLDS

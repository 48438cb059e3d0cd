"""corectl.fleet.systemd_units_to_act: the controller's timers compared with one `systemctl show`."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "collections"))  # the filter's import of module_utils, as Ansible ships them
PLUGIN = ROOT / "collections/ansible_collections/corectl/fleet/plugins/filter/systemd.py"
spec = importlib.util.spec_from_file_location("corectl_systemd_filter", PLUGIN)
assert spec and spec.loader
systemd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(systemd)

# systemctl show -p Id -p LoadState -p UnitFileState -p ActiveState (systemd 252, Debian 12): properties in
# systemd's own order, a blank line between units; a unit without a unit file is "not-found" and inactive
SHOW = """\
Id=corectl-slurm-metrics.timer
LoadState=loaded
ActiveState=active
UnitFileState=enabled

Id=corectl-spares.timer
LoadState=loaded
ActiveState=inactive
UnitFileState=disabled

Id=corectl-validation.timer
LoadState=loaded
ActiveState=active
UnitFileState=enabled

Id=corectl-validation-pairs.timer
LoadState=not-found
ActiveState=inactive
UnitFileState=
"""


def wanted(**overrides: tuple[bool, bool]) -> list[dict]:
    runs = {"metrics": (True, False), "spares": (True, False), "validation": (True, False), "pairs": (False, False)}
    runs.update(overrides)
    names = {
        "metrics": "corectl-slurm-metrics.timer",
        "spares": "corectl-spares.timer",
        "validation": "corectl-validation.timer",
        "pairs": "corectl-validation-pairs.timer",
    }
    return [{"name": names[key], "run": run, "changed": changed} for key, (run, changed) in runs.items()]


def test_a_converged_controller_has_nothing_to_act_on():
    show = SHOW.replace("ActiveState=inactive\nUnitFileState=disabled", "ActiveState=active\nUnitFileState=enabled")
    assert systemd.systemd_units_to_act(show, wanted()) == {"stop": [], "run": []}


def test_a_stopped_or_changed_timer_runs_and_a_changed_one_restarts():
    acts = systemd.systemd_units_to_act(SHOW, wanted(metrics=(True, True)))
    assert acts == {
        "stop": [],
        "run": [
            {"name": "corectl-slurm-metrics.timer", "changed": True},
            {"name": "corectl-spares.timer", "changed": False},
        ],
    }


def test_a_timer_no_longer_wanted_stops_only_where_systemd_still_has_it():
    acts = systemd.systemd_units_to_act(SHOW, wanted(validation=(False, True), pairs=(False, False)))
    assert acts["stop"] == ["corectl-validation.timer"]  # pairs: no unit file, nothing to stop
    # templated flags arrive as strings on some paths: "False" is false
    assert systemd.systemd_units_to_act(SHOW, [{"name": "corectl-validation.timer", "run": "False"}])["stop"] == [
        "corectl-validation.timer"
    ]


def test_a_unit_systemctl_said_nothing_of_is_an_error():
    with pytest.raises(ValueError, match=r"said nothing of corectl-other\.timer"):
        systemd.systemd_units_to_act(SHOW, [{"name": "corectl-other.timer", "run": True}])

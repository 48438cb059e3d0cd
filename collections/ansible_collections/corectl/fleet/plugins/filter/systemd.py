# corectl: a role's services or timers compared with what systemd runs, in one read.
"""``systemd_units_to_act``: which of a role's units to stop and which to (re)start, from one
``systemctl show -p Id -p LoadState -p UnitFileState -p ActiveState UNIT...``.

A converged node runs that one command and no systemd task at all (each ansible.builtin.systemd_service
task is a module run that finds nothing to do there). ``wanted``: one entry per unit (its full name,
``x.service`` or ``x.timer``), ``{name, run, changed}``: run, whether it should be enabled and running
(default true); changed, whether its units or program changed in this run (it is restarted, after a
daemon-reload; default false).

- stop: the units not wanted that systemd has loaded and still enables or runs;
- run: the units wanted that changed, are not enabled or are not active, as ``{name, changed}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.corectl.fleet.plugins.module_utils.systemd_units import RUNNING_STATES, systemd_show


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def systemd_units_to_act(output: str, wanted: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    units = systemd_show(output)
    stop: list[str] = []
    run: list[dict[str, Any]] = []
    for entry in wanted:
        name = str(entry["name"])
        if name not in units:
            raise ValueError(f"systemd_units_to_act: systemctl show said nothing of {name}")
        fields = units[name]
        enabled = fields.get("UnitFileState") == "enabled"
        active = fields.get("ActiveState") in RUNNING_STATES
        changed = _flag(entry.get("changed", False))
        if _flag(entry.get("run", True)):
            if changed or not enabled or not active:
                run.append({"name": name, "changed": changed})
        elif fields.get("LoadState") == "loaded" and (enabled or active):
            stop.append(name)
    return {"stop": stop, "run": run}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"systemd_units_to_act": systemd_units_to_act}

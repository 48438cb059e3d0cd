# corectl: what `systemctl show` says of units, read alike by corectl.fleet's modules and filters.
from __future__ import annotations

# ActiveState values for a unit that runs or is on its way (what ansible.builtin.systemd_service counts as started)
RUNNING_STATES = ("active", "activating", "reloading")

# One read of every loaded service and timer: a unit enabled and running is always loaded.
SHOW_ALL_ARGV = ["systemctl", "show", "-p", "Id", "-p", "UnitFileState", "-p", "ActiveState", "*.service", "*.timer"]


def systemd_show(output: str) -> dict[str, dict[str, str]]:
    """``systemctl show`` of several units: each unit's properties by its Id."""
    found = {}
    for block in output.replace("\r\n", "\n").strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if fields.get("Id"):
            found[fields["Id"]] = fields
    return found


def enabled_and_running(output: str) -> list[str]:
    """The units ``systemctl show`` calls enabled and running, sorted: the ones a start task finds nothing to do for."""
    return sorted(
        name
        for name, fields in systemd_show(output).items()
        if fields.get("UnitFileState") == "enabled" and fields.get("ActiveState") in RUNNING_STATES
    )

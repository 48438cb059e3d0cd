"""Service checks: systemd units active, and the clock synchronised by chrony."""

from __future__ import annotations

import shutil
import time

from .core import CheckFailed, Node, Skip
from .sticky import read_json_state, write_json_state

# chrony's reference ID while it serves its own clock (the `local` directive, 127.127.1.1): synchronised to nothing.
CHRONY_LOCAL_REFID = "7F7F0101"
# when this node's chrony was first seen unsynchronised (kept between runs; gone once it syncs again)
CLOCK_STATE = "clock.json"


def check_services(node: Node) -> str:
    units = node.config["services"]
    if not units:
        raise Skip("no services declared")
    down = []
    for unit in units:
        state = node.service_state(unit)
        if state != "active":
            down.append(f"{unit} is {state}")
    if down:
        raise CheckFailed(", ".join(down))
    return f"{', '.join(units)} active"


def check_clock(node: Node) -> str:
    if not node.config["clock"]:
        raise Skip("clock check off")
    if shutil.which("chronyc") is None:
        raise CheckFailed("chronyc not found (clock check is on; is chrony installed?)")
    result = node.run("chronyc", "-c", "tracking")
    if result.rc != 0:
        raise CheckFailed(f"chronyc tracking failed (rc {result.rc}): {result.first_line() or 'no output'}")
    fields = result.stdout.strip().splitlines()[-1].split(",") if result.stdout.strip() else []
    if len(fields) < 14:
        raise CheckFailed(f"unexpected chronyc -c tracking output: {result.first_line()!r}")
    leap, source = fields[13].strip(), fields[1].strip() or fields[0].strip()
    if leap not in ("Normal", "Insert second", "Delete second"):
        return unsynchronised(node, leap)
    if read_json_state(node.config, CLOCK_STATE):
        write_json_state(node.config, CLOCK_STATE, {})
    if fields[0].strip().upper() == CHRONY_LOCAL_REFID:  # leap status Normal: chrony vouches for its own clock
        raise CheckFailed(
            f"clock not synchronised to a real source: chrony is serving its local clock "
            f"(reference ID {fields[0].strip()}, stratum {fields[2].strip()}; the `local` directive, no NTP source)"
        )
    try:
        offset = f", offset {float(fields[4]) * 1000:.3f} ms"
    except ValueError:
        offset = ""
    return f"synchronised to {source} (stratum {fields[2]}{offset})"


def unsynchronised(node: Node, leap: str) -> str:
    """chrony lost its sources (a restart, an NTP server away, samples too jittery to select): a warning until
    it has been so for clock_unsynced_grace_s (a clock that was synchronised drifts milliseconds meanwhile), then
    a failure."""
    config, now = node.config, int(time.time())
    since = read_json_state(config, CLOCK_STATE).get("unsynced_since")
    if not isinstance(since, int) or since > now:
        since = now
        write_json_state(config, CLOCK_STATE, {"unsynced_since": since})
    grace, lasted = config["clock_unsynced_grace_s"], now - since
    if lasted >= grace:
        raise CheckFailed(f"clock not synchronised for {lasted} s (chrony leap status {leap})")
    return f"warning: clock not synchronised for {lasted} s (chrony leap status {leap}); fails after {grace} s"

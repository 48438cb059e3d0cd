"""Network checks: InfiniBand ports active at their rate, their error counters and link flaps, the GPUDirect
RDMA module loaded."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from .core import CheckFailed, Node, Skip, _read, summarize
from .sticky import keep, read_json_state, when, write_json_state


def check_ib(node: Node) -> str:
    config = node.config
    want_ports, want_rate = config["ib_ports"], config["ib_rate_gbps"]
    if want_ports <= 0 and want_rate <= 0:
        raise Skip("no InfiniBand ports expected")
    root = Path(config["ib_sysfs_root"])
    ports = sorted(root.glob("*/ports/*"))
    good, problems = [], []
    for port in ports:
        layer = _read(port / "link_layer")
        if layer and layer != "InfiniBand":
            continue
        name = f"{port.parent.parent.name}/{port.name}"
        state = _read(port / "state")  # "4: ACTIVE"
        rate_text = _read(port / "rate")  # "400 Gb/sec (4X NDR)"
        match = re.match(r"(\d+(?:\.\d+)?)", rate_text)
        rate = float(match.group(1)) if match else 0.0
        if not state.endswith("ACTIVE"):
            problems.append(f"{name} {state.split(': ')[-1] or 'unknown'}")
        elif want_rate > 0 and rate < want_rate:
            problems.append(f"{name} at {rate:g} Gb/s < {want_rate}")
        else:
            good.append(name)
    if want_ports > 0 and len(good) < want_ports:
        detail = summarize(problems) if problems else f"{len(ports)} ports under {root}"
        raise CheckFailed(f"{len(good)} of {want_ports} IB ports active at {want_rate or 'any'} Gb/s: {detail}")
    if want_ports <= 0 and problems:
        raise CheckFailed(summarize(problems))
    return f"{len(good)} IB ports active" + (f" at >= {want_rate} Gb/s" if want_rate else "")


IB_COUNTERS_STATE = "ib-counters.json"
# The widths of the InfiniBand PortCounters (IBA specification; the kernel's counters/ files read them): a counter
# stops at its maximum instead of wrapping, so one at its maximum can no longer show an increase until the port's
# counters are reset (`perfquery -R`).
COUNTER_MAX = {
    "symbol_error": 0xFFFF,
    "link_error_recovery": 0xFF,
    "link_downed": 0xFF,
    "port_rcv_errors": 0xFFFF,
    "port_rcv_remote_physical_errors": 0xFFFF,
    "port_rcv_switch_relay_errors": 0xFFFF,
    "port_xmit_discards": 0xFFFF,
    "port_xmit_constraint_errors": 0xFF,
    "port_rcv_constraint_errors": 0xFF,
    "local_link_integrity_errors": 0xF,
    "excessive_buffer_overrun_errors": 0xF,
    "VL15_dropped": 0xFFFF,
}
RESET = "reset the port's counters with perfquery -R once the cause is found"


def ib_counters(root: Path, names: list[str]) -> dict[str, dict[str, int]]:
    """ "<device>/<port>" -> counter -> value, from <root>/<device>/ports/<port>/counters/ (InfiniBand ports)."""
    found: dict[str, dict[str, int]] = {}
    for port in sorted(root.glob("*/ports/*")):
        layer = _read(port / "link_layer")
        if layer and layer != "InfiniBand":
            continue
        values = {name: _read(port / "counters" / name) for name in names}
        found[f"{port.parent.parent.name}/{port.name}"] = {name: int(v) for name, v in values.items() if v.isdigit()}
    return found


def saturated(port: str, values: dict[str, int]) -> tuple[list[dict[str, Any]], list[str]]:
    """The counters of ``port`` at their maximum: link_downed there fails (flaps can no longer be counted, so the
    port can no longer be judged), any other counter is a warning (its increases can no longer be seen)."""
    failed, warned = [], []
    for name, value in values.items():
        if name not in COUNTER_MAX or value < COUNTER_MAX[name]:
            continue
        if name == "link_downed":
            message = f"{port} link_downed at its maximum {value}: its link flaps can no longer be counted ({RESET})"
            failed.append({"check": "ib-errors", "key": f"ib {port} link_downed max", "message": message})
        else:
            warned.append(f"{port} {name} at its maximum {value}")
    return failed, warned


def check_ib_errors(node: Node) -> str:
    """InfiniBand error counters that jumped since the last run, transmit discards above their own limit, links
    that went down (a flap: the port is up again, its link_downed counter higher), and a link_downed counter at its
    maximum (it can no longer count flaps): kept on the node until heal or an operator ends them, as a hardware Xid
    is. Another counter at its maximum is a warning. A lower value than last time (a reboot, a counter reset)
    starts anew."""
    config = node.config
    if config["ib_ports"] <= 0 and config["ib_rate_gbps"] <= 0:
        raise Skip("no InfiniBand ports expected")
    names = [str(name) for name in config["ib_error_counters"]]
    now = ib_counters(Path(config["ib_sysfs_root"]), [*names, "link_downed", "port_xmit_discards"])
    before = read_json_state(config, IB_COUNTERS_STATE)
    since = int(before.get("at", 0))
    limits = {
        "link_downed": config["ib_link_downed_max"],
        "port_xmit_discards": config["ib_xmit_discards_increase_max"],
    }
    seen, warnings = [], []
    for port, values in now.items():
        failed, warned = saturated(port, values)
        seen += failed
        warnings += warned
        for name, value in values.items():
            last = before.get("ports", {}).get(port, {}).get(name)
            if not isinstance(last, int) or value < last or (name == "link_downed" and failed):
                continue  # (a link_downed at its maximum is that port's failure, whatever it grew by)
            jump, limit = value - last, limits.get(name, config["ib_error_increase_max"])
            if jump > limit:
                what = f"went down {jump} times" if name == "link_downed" else f"{name} +{jump}"
                message = f"{port} {what} since {when(since)} (max {limit})"
                seen.append(
                    {"check": "ib-errors", "key": f"ib {port} {name}", "message": message, "advice": "check the cable"}
                )
    write_json_state(config, IB_COUNTERS_STATE, {"at": int(time.time()), "ports": now})
    kept = keep(config, "ib-errors", seen)
    if kept:
        more = f" (and {len(kept) - 1} more kept)" if len(kept) > 1 else ""
        raise CheckFailed(
            f"{kept[-1]['message']}{more} [kept since {when(kept[-1]['since'])} until corectl heal or corectl resume]"
        )
    warning = f"warning: {summarize(warnings, 2)} ({RESET}); " if warnings else ""
    if not since:
        return f"{warning}{len(now)} IB ports' error counters read (first run: nothing to compare)"
    return f"{warning}no IB error counter jumped and no link went down on {len(now)} ports since {when(since)}"


def check_gpudirect(node: Node) -> str:
    """The GPUDirect RDMA module (nvidia_peermem) is loaded: listed in /proc/modules ("name size refcount deps
    state offset"). The kernel treats '-' and '_' in module names alike and lists them with '_'."""
    config = node.config
    want = config["gpudirect_module"].strip()
    if not want:
        raise Skip("GPUDirect RDMA not asked for")
    key = want.replace("-", "_")
    path = Path(config["modules_file"])
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CheckFailed(f"cannot read {path}: {exc.strerror or exc} (GPUDirect RDMA module {key})") from None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0].replace("-", "_") == key:
            return f"{fields[0]} loaded"
    raise CheckFailed(f"{key} not loaded (GPUDirect RDMA)")

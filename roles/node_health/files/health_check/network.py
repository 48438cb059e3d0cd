"""Network checks: InfiniBand ports active at their rate, their error counters and link flaps, the GPUDirect
RDMA module loaded."""

from __future__ import annotations

import re
import time
from pathlib import Path

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


def check_ib_errors(node: Node) -> str:
    """InfiniBand error counters that jumped since the last run, and links that went down (a flap: the
    port is up again, its link_downed counter higher): kept on the node until heal or an operator
    ends them, as a hardware Xid is. A lower value than last time (a reboot, a counter reset) starts
    anew."""
    config = node.config
    if config["ib_ports"] <= 0 and config["ib_rate_gbps"] <= 0:
        raise Skip("no InfiniBand ports expected")
    names = [str(name) for name in config["ib_error_counters"]]
    now = ib_counters(Path(config["ib_sysfs_root"]), [*names, "link_downed"])
    before = read_json_state(config, IB_COUNTERS_STATE)
    since = int(before.get("at", 0))
    error_max, downed_max = config["ib_error_increase_max"], config["ib_link_downed_max"]
    seen = []
    for port, values in now.items():
        for name, value in values.items():
            last = before.get("ports", {}).get(port, {}).get(name)
            if not isinstance(last, int) or value < last:
                continue
            jump, limit = value - last, downed_max if name == "link_downed" else error_max
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
    if not since:
        return f"{len(now)} IB ports' error counters read (first run: nothing to compare)"
    return f"no IB error counter jumped and no link went down on {len(now)} ports since {when(since)}"


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

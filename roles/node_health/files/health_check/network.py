"""Network checks: InfiniBand ports active at their rate, the GPUDirect RDMA module loaded."""

from __future__ import annotations

import re
from pathlib import Path

from .core import CheckFailed, Node, Skip, _read, summarize


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

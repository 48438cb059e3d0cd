"""Storage checks: every expected mount point mounted and writable (probed in a child, so a hung
file system cannot hang the checker), and the node's NVMe drives present and healthy."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from .core import CheckFailed, Node, Skip, _read, run, summarize


def mount_points() -> list[str]:
    points = []
    for line in _read(Path("/proc/self/mounts")).splitlines():
        fields = line.split()
        if len(fields) >= 2:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
    return points


WRITE_PROBE = (
    "import os,sys\n"
    "p=os.path.join(sys.argv[1],'.corectl-health-%d'%os.getpid())\n"
    "fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_EXCL,0o600)\n"
    "os.write(fd,b'ok');os.fsync(fd);os.close(fd);os.unlink(p)\n"
)


def check_mounts(node: Node) -> str:
    config = node.config
    wanted = config["mounts"]
    if not wanted:
        raise Skip("no mounts declared")
    mounted = set(mount_points())
    problems = []
    for path in wanted:
        point = os.path.normpath(path)
        if point not in mounted:
            problems.append(f"{point} not mounted")
            continue
        # a write in a child process with a timeout: a hung network file system must not hang us
        try:
            probe = run([sys.executable, "-c", WRITE_PROBE, point], node.timeout)
        except CheckFailed:
            problems.append(f"{point} not answering (write timed out after {node.timeout:g} s)")
            continue
        if probe.rc != 0:
            lines = probe.stderr.strip().splitlines()
            problems.append(f"{point} not writable: {lines[-1] if lines else 'rc ' + str(probe.rc)}")
    if problems:
        raise CheckFailed(summarize(problems))
    return f"{', '.join(wanted)} mounted and writable"


# The SMART critical warning's bits (NVMe Base Specification, SMART / Health Information log page, byte 0)
NVME_CRITICAL_WARNINGS = (
    (0x01, "spare capacity below its threshold"),
    (0x02, "temperature past a threshold"),
    (0x04, "reliability degraded (media or internal errors)"),
    (0x08, "read-only"),
    (0x10, "volatile memory backup failed"),
    (0x20, "persistent memory region read-only"),
)


def nvme_controllers(root: Path) -> dict[str, str]:
    """This host's PCIe NVMe controllers (<root>/nvme<N>, as /sys/class/nvme lists them) -> their state
    ("live" while working); controllers of NVMe over Fabrics (transport tcp, rdma, fc) are not drives of
    this node."""
    found = {}
    for controller in sorted(root.glob("nvme[0-9]*"), key=lambda p: int(p.name[4:]) if p.name[4:].isdigit() else 0):
        transport = _read(controller / "transport")
        if transport and transport != "pcie":
            continue
        found[controller.name] = _read(controller / "state") or "unknown"
    return found


def numbers(names: dict[str, str]) -> str:
    """nvme0, nvme1, nvme2, nvme5 -> "[0-2,5]" (as Slurm writes a host list)."""
    found = sorted(int(name[4:]) for name in names if name[4:].isdigit())
    runs: list[list[int]] = []
    for n in found:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return text if len(found) == 1 else f"[{text}]"


def critical_warning(log: dict[str, Any]) -> int:
    """The SMART log's critical warning byte: a number (nvme-cli 1.x and 2.x), or an object holding it
    as "value" with one field per bit (newer nvme-cli)."""
    value = log.get("critical_warning")
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"no critical_warning number in the SMART log: {value!r}")
    return value


def warning_names(value: int) -> str:
    names = [name for bit, name in NVME_CRITICAL_WARNINGS if value & bit]
    unknown = value & ~sum(bit for bit, _ in NVME_CRITICAL_WARNINGS)
    return ", ".join([*names, *([f"unknown bits 0x{unknown:02x}"] if unknown else [])])


def check_nvme(node: Node) -> str:
    """Every expected NVMe drive present and live, and none raising a SMART critical warning (nvme-cli's
    smart-log); the highest wear (percent_used) is in the message."""
    config = node.config
    expected = config["nvme_count"]
    if not expected:
        raise Skip("no NVMe drives expected (nvme_count 0)")
    root = Path(config["nvme_sysfs_root"])
    controllers = nvme_controllers(root)
    problems = []
    if len(controllers) < expected:
        present = f"nvme{numbers(controllers)}" if controllers else "none"
        problems.append(f"{len(controllers)} of {expected} NVMe drives present: {present}")
    problems += [f"{name} {state}" for name, state in controllers.items() if state != "live"]
    worn, read = [], 0
    for name, state in controllers.items():
        if state != "live" or not config["nvme_smart_command"]:
            continue
        argv = [part.replace("{device}", f"/dev/{name}") for part in config["nvme_smart_command"]]
        result = node.run(*argv)
        try:
            if result.rc != 0:
                raise ValueError(f"rc {result.rc}: {result.first_line() or 'no output'}")
            log = json.loads(result.stdout)
            if not isinstance(log, dict):
                raise ValueError("not a JSON object")
            warning = critical_warning(log)
        except ValueError as exc:
            problems.append(f"{name} SMART log unreadable ({exc})")
            continue
        read += 1
        if warning:
            problems.append(f"{name} SMART critical warning 0x{warning:02x}: {warning_names(warning)}")
        used = log.get("percent_used", log.get("percentage_used"))
        if isinstance(used, int):
            worn.append((used, name))
    if problems:
        raise CheckFailed(summarize(problems))
    if not read:
        return f"{len(controllers)} NVMe drives live (SMART not read: nvme_smart_command empty)"
    wear = f"; most worn: {max(worn)[1]} at {max(worn)[0]}% of its rated endurance" if worn else ""
    return f"{len(controllers)} NVMe drives live, no SMART critical warning{wear}"

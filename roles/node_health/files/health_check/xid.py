"""Xid checks: the GPU errors the kernel logged in the window, and GPUs that fell off the bus, each classed
by NVIDIA's Xid catalog (xid_catalog: Xid -> [immediate action, investigatory action], the site's xid_classes
over it); hardware-class ones are kept on the node (sticky.py) until heal or an operator clears them."""

from __future__ import annotations

import re
import shlex
from typing import Any

from .core import CheckFailed, Node, Skip, needs_gpus, summarize
from .sticky import keep, seconds_since_clear, when

XID_LINE = re.compile(r"NVRM: Xid \((PCI:[0-9A-Fa-f:.]+)((?: GPU-C?I:\d+)*)\): (\d+),\s*(.*)")
XID_NOISE = re.compile(r"^(?:pid=[^,]*,\s*|name=[^,]*,\s*)+")
# A GPU lost without an Xid line. At probe time the driver (osapi.c) prints one message over three lines, which
# dmesg, journalctl and syslog continue with their own prefixes: "NVRM: The NVIDIA GPU 0000:b3:00.0" / "NVRM: (PCI
# ID: 10de:26b5) installed in this system has" / "NVRM: fallen off the bus and is not responding to commands."
# At run time it follows Xid 79 with "NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus."
_NOT_NEXT_GPU = r"(?:(?!NVRM: The NVIDIA GPU )[^\n])"  # a character of the same message, not of the next one
BUS_LOST_PROBE = re.compile(
    r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]"
    rf"((?:{_NOT_NEXT_GPU}*\n){{0,3}}?{_NOT_NEXT_GPU}*?)fallen off the bus and is not responding to commands"
)
BUS_LOST_LINE = re.compile(
    r"NVRM: GPU ([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]: GPU has fallen off the bus"
)
PCI_ID = re.compile(r"\(PCI ID: ([0-9A-Fa-f]{4}:[0-9A-Fa-f]{4})\)")
# Xid 154 (drivers 550+): "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"; newer
# drivers name the actions otherwise ("0x2 (OS Reboot)"), so the code counts, and 0x0 is None.
RECOVERY_ACTION = re.compile(r"recovery action changed from \S+ \([^)]*\) to (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)")
XID_CLASSES = ("ignore", "application", "hardware")
# The catalog's immediate actions that are not the GPU's fault; IGNORE drains nothing, every other action
# (and an Xid the catalog does not list) is hardware.
APPLICATION_ACTIONS = ("RESTART_APP", "WORKFLOW_XID_45")


def xid_events(text: str) -> list[tuple[str, int, str, str]]:
    """(PCI address, XID, description, MIG instance or "") per NVRM Xid line of a kernel log."""
    events = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if match:
            detail = XID_NOISE.sub("", match.group(4)).strip()
            events.append((match.group(1), int(match.group(3)), detail, match.group(2).strip()))
    return events


XID_PCI = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})")


def gpu_indexes(node: Node) -> dict[tuple[int, ...], str]:
    """(domain, bus, device) -> the GPU's nvidia-smi index (the one CUDA_VISIBLE_DEVICES and every other tool use),
    from the query every GPU check shares; none where nvidia-smi does not answer (a GPU that fell off the bus can
    take it down: the Xid is then named by its PCI address alone)."""
    try:
        rows = node.query(["index", "pci.bus_id"])
    except CheckFailed:
        return {}
    found = {}
    for row in rows:
        match = XID_PCI.search(row.get("pci.bus_id", ""))
        if match:
            found[tuple(int(part, 16) for part in match.groups())] = row.get("index", "?")
    return found


def named(pci: str, mig: str, indexes: dict[tuple[int, ...], str]) -> str:
    """``PCI:0000:3a:00 (GPU 2)``: an Xid line's GPU by its address and, where nvidia-smi lists it, its index."""
    match = XID_PCI.search(pci)
    index = indexes.get(tuple(int(part, 16) for part in match.groups())) if match else None
    said = ", ".join(part for part in (f"GPU {index}" if index is not None else "", mig) if part)
    return f"{pci} ({said})" if said else pci


def bus_lost(text: str) -> list[tuple[str, str]]:
    """(PCI address as Xid lines write it, what happened) per GPU the kernel log says has fallen off the bus.

    One entry per GPU, in the order of the log; the probe-time message ("not responding to commands", with the
    PCI ID) wins over the short run-time one.
    """
    found: dict[str, tuple[int, str]] = {}
    for match in BUS_LOST_PROBE.finditer(text):
        pci_id = PCI_ID.search(match.group(2))
        detail = "has fallen off the bus and is not responding to commands"
        detail += f" (PCI ID {pci_id.group(1).lower()})" if pci_id else ""
        found[f"PCI:{match.group(1).lower()}"] = (match.start(), detail)
    for match in BUS_LOST_LINE.finditer(text):
        found.setdefault(f"PCI:{match.group(1).lower()}", (match.start(), "has fallen off the bus"))
    return [(pci, detail) for pci, (_start, detail) in sorted(found.items(), key=lambda item: item[1][0])]


def xid_class(config: dict[str, Any], xid: int, detail: str) -> tuple[str, str]:
    """(class, what NVIDIA's catalog says to do) of one Xid event."""
    immediate, investigatory = (config["xid_catalog"].get(str(xid)) or ["", ""])[:2]
    advice = f"NVIDIA: {immediate}, then {investigatory}" if immediate else "not in the Xid catalog"
    if str(xid) in config["xid_classes"]:
        return config["xid_classes"][str(xid)], advice
    if xid == 154:
        found = RECOVERY_ACTION.search(detail)
        if found:
            none = int(found.group(1), 0) == 0
            return ("ignore" if none else "hardware"), f"driver: {found.group(2)}"
    if immediate == "IGNORE":
        return "ignore", advice
    if immediate in APPLICATION_ACTIONS:
        return "application", advice
    return "hardware", advice


def kernel_log(node: Node) -> tuple[str, int]:
    """The kernel log of the window (shorter when kept failures were cleared since), and the window."""
    config = node.config
    window = seconds_since_clear(config, config["xid_window_s"])
    command = config["xid_command"]
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    argv = [part.replace("{window}", str(window)) for part in argv]
    if not argv:
        raise Skip("no kernel log command (xid_command empty)")
    result = node.run(*argv)
    if result.rc != 0:
        raise CheckFailed(
            f"cannot read the kernel log ({argv[0]} rc {result.rc}): {result.first_line() or 'no output'}"
        )
    return result.stdout, window


def check_xid(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    text, window = kernel_log(node)
    all_events = xid_events(text)
    seen: list[dict[str, Any]] = []
    reported: list[str] = []
    # A GPU that fell off the bus counts as Xid 79, once: its message is kept only where no Xid 79 line names the
    # same GPU (the driver prints both at run time, only the message when the probe finds it gone).
    with_79 = {e[0].lower() for e in all_events if e[1] == 79}
    lost_class, lost_advice = xid_class(config, 79, "")
    for pci, what in bus_lost(text) if lost_class == "hardware" else []:
        if pci.lower() not in with_79:
            message = f"GPU on {pci} {what}; no Xid 79 logged for it"
            seen.append({"check": "xid", "key": f"lost {pci.lower()}", "message": message, "advice": lost_advice})
    indexes = gpu_indexes(node) if all_events else {}
    for pci, xid, detail, mig in all_events:
        kind, advice = xid_class(config, xid, detail)
        where = named(pci, mig, indexes)
        if kind == "application":
            reported.append(f"XID {xid} on {where}")
        elif kind == "hardware":
            key = f"xid {xid} {pci.lower()}{f' {mig}' if mig else ''}"
            seen.append({"check": "xid", "key": key, "message": f"XID {xid} on {where}: {detail}", "advice": advice})
    kept = keep(config, "xid", seen)
    if kept:
        # the GPU lost from the bus first (the most severe), else the latest
        shown = next((r for r in kept if r["key"].startswith("lost ")), kept[-1])
        more = f" (and {len(kept) - 1} more kept)" if len(kept) > 1 else ""
        raise CheckFailed(
            f"{shown['message']}{more} [{shown.get('advice', '')}; kept since {when(shown['since'])}"
            " until corectl heal or corectl resume]"
        )
    if reported:
        return f"warning: application errors, not drained: {summarize(reported, 3)} (last {window} s)"
    return f"no XID errors in the last {window} s"


# PCIe Advanced Error Reporting in the kernel log: "pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected
# (Fatal), type=Transaction Layer, ..." (kernels before 6.x: "Uncorrected", later "Uncorrectable"), and the
# summary "AER: [Multiple ]Uncorrected (Fatal) error received: ...". Corrected errors are no failure.
PCI_DEVICE = r"(?P<device>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
AER_ERROR = re.compile(
    rf"{PCI_DEVICE}: (?:PCIe Bus Error: severity=|AER: (?:Multiple )?)"
    r"(?:Uncorrected|Uncorrectable) \((?P<kind>Fatal|Non-Fatal)\)"
)
AER_DETAIL = re.compile(
    r"(?P<device>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):\s+\[\s*\d+\]\s+(?P<what>.+?)\s*(?:\(First\))?\s*$"
)


def aer_errors(text: str) -> list[tuple[str, str, str]]:
    """(device, Fatal or Non-Fatal, the first error named after it) per uncorrectable PCIe error of a kernel
    log, once per device and kind, in the order of the log."""
    found: dict[tuple[str, str], str] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines):
        match = AER_ERROR.search(line)
        if not match:
            continue
        device, kind = match.group("device").lower(), match.group("kind")
        detail = next(
            (d.group("what").strip() for d in map(AER_DETAIL.search, lines[number + 1 : number + 6]) if d), ""
        )
        if not found.get((device, kind)):
            found[(device, kind)] = detail
    return [(device, kind, detail) for (device, kind), detail in found.items()]


def check_aer(node: Node) -> str:
    """A fatal uncorrectable PCIe error in the kernel log fails the node and is kept (as a hardware Xid);
    a non-fatal one is reported in the message."""
    config = node.config
    text, window = kernel_log(node)
    errors = aer_errors(text)
    seen = [
        {
            "check": "aer",
            "key": f"aer {device}",
            "message": f"fatal PCIe error at {device}{f' ({what})' if what else ''}",
        }
        for device, kind, what in errors
        if kind == "Fatal"
    ]
    kept = keep(config, "aer", seen)
    if kept:
        more = f" (and {len(kept) - 1} more kept)" if len(kept) > 1 else ""
        raise CheckFailed(
            f"{kept[0]['message']}{more} [kept since {when(kept[0]['since'])} until corectl heal or corectl resume]"
        )
    non_fatal = [f"{device}{f' ({what})' if what else ''}" for device, kind, what in errors if kind == "Non-Fatal"]
    if non_fatal:
        return f"warning: non-fatal uncorrectable PCIe errors: {summarize(non_fatal, 3)} (last {window} s)"
    return f"no uncorrectable PCIe errors in the last {window} s"

"""Xid checks: the GPU errors the kernel logged in the window, and GPUs that fell off the bus."""

from __future__ import annotations

import re
import shlex

from .core import CheckFailed, Node, Skip, needs_gpus, summarize

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


def xid_events(text: str) -> list[tuple[str, int, str, str]]:
    """(PCI address, XID, description, MIG instance or "") per NVRM Xid line of a kernel log."""
    events = []
    for line in text.splitlines():
        match = XID_LINE.search(line)
        if match:
            detail = XID_NOISE.sub("", match.group(4)).strip()
            events.append((match.group(1), int(match.group(3)), detail, match.group(2).strip()))
    return events


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


def check_xid(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    window = config["xid_window_s"]
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
    ignore = set(config["xid_ignore"])
    all_events = xid_events(result.stdout)
    events = [e for e in all_events if e[1] not in ignore]
    # A GPU that fell off the bus counts as Xid 79, once: its message is reported only where no Xid 79 line
    # names the same GPU (the driver prints both at run time, only the message when the probe finds it gone).
    with_79 = {e[0].lower() for e in all_events if e[1] == 79}
    lost = [] if 79 in ignore else [(pci, what) for pci, what in bus_lost(result.stdout) if pci.lower() not in with_79]
    if lost:
        more = f" (and {len(events)} XID events in {window} s)" if events else ""
        gpus = [f"GPU on {pci} {what}" for pci, what in lost]
        raise CheckFailed(f"{summarize(gpus, 2)}; no Xid 79 logged for {'it' if len(lost) == 1 else 'them'}{more}")
    if events:
        pci, xid, detail, mig = events[-1]
        more = f" ({len(events)} XID events in {window} s)" if len(events) > 1 else ""
        raise CheckFailed(f"XID {xid} on {pci}{f' ({mig})' if mig else ''}: {detail}{more}")
    ignored = f", ignoring {', '.join(str(x) for x in sorted(ignore))}" if ignore else ""
    return f"no XID errors in the last {window} s{ignored}"

"""Host memory: uncorrectable errors the memory controllers counted (EDAC), per DIMM where the kernel says which,
and those the persistent kernel log still holds after the boot that reset the counts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .core import CheckFailed, Node, Skip, _read, summarize
from .sticky import keep, read_json_state, when, write_json_state
from .xid import kernel_log


def edac_counts(root: Path) -> dict[str, tuple[int, int]]:
    """Memory controller -> (uncorrectable, correctable) errors, from <root>/mc*/{ue,ce}_count."""
    found = {}
    for controller in sorted(root.glob("mc[0-9]*")):
        ue, ce = _read(controller / "ue_count"), _read(controller / "ce_count")
        if ue.isdigit() and ce.isdigit():
            found[controller.name] = (int(ue), int(ce))
    return found


def dimm_counts(root: Path) -> dict[str, list[tuple[str, int, int]]]:
    """Memory controller -> [(DIMM, uncorrectable, correctable)] from the per-DIMM counters: <mc>/dimm*/ (the
    layout of current kernels) or <mc>/rank*/ (drivers that count per rank), each named by its dimm_label where
    the platform gives one, else by its directory."""
    found: dict[str, list[tuple[str, int, int]]] = {}
    for controller in sorted(root.glob("mc[0-9]*")):
        dimms = sorted(controller.glob("dimm[0-9]*")) or sorted(controller.glob("rank[0-9]*"))
        for dimm in dimms:
            ue, ce = _read(dimm / "dimm_ue_count"), _read(dimm / "dimm_ce_count")
            if ue.isdigit() and ce.isdigit():
                label = _read(dimm / "dimm_label") or dimm.name
                found.setdefault(controller.name, []).append((label, int(ue), int(ce)))
    return found


# The EDAC core's line for an uncorrectable error (drivers/edac/edac_mc.c): "EDAC MC<n>: <count> UE <what> on <DIMM>
# (<location> ...)", as Intel's skx/i10nm drivers print it ("1 UE memory read error on CPU_SrcID#0_MC#3_Chan#0_DIMM#0
# (channel:0 ..."), or with no <what>, as amd64_edac does ("1 UE on mc#0csrow#0channel#0 (csrow:0 ..."). A corrected
# error says CE and is no failure. The same error may be logged twice (two signals): one kept record per DIMM.
EDAC_UE_LINE = re.compile(r"EDAC (MC\d+): (\d+) UE\b(?P<rest>.*)")
LOCATED = re.compile(r"\s*(?:(?P<what>.*?)\s+)?on (?P<dimm>\S+)")


def logged_ue(text: str) -> list[tuple[str, int, str, str]]:
    """(controller as sysfs names it, count, what, DIMM label or "") per uncorrectable EDAC line of a kernel log."""
    found = []
    for line in text.splitlines():
        match = EDAC_UE_LINE.search(line)
        if not match:
            continue
        rest = match["rest"].split(" (", 1)[0]
        located = LOCATED.match(rest)
        what = (located["what"] if located else rest) or ""
        dimm = located["dimm"] if located else ""
        found.append((match[1].lower(), int(match[2]), what.strip() or "memory error", dimm))
    return found


EDAC_STATE = "edac-counts.json"


def check_edac(node: Node) -> str:
    """Uncorrectable host memory errors (EDAC): a count above edac_ue_max when first seen, or one that grew
    since the last run, fails the node and is kept, naming the DIMMs whose own counts hold them (the kernel's
    counts start from 0 at a boot; the DIMM is no better for it). An uncorrectable error that crashed the node is
    only in the persistent kernel log after the reboot: one logged in the kernel log's window (xid_window_s,
    shortened since a clear) fails the node too. A count already judged and ended by heal or an operator is not
    judged again until it grows. Correctable errors are counted in the message."""
    config = node.config
    root = Path(config["edac_sysfs_root"])
    counts = edac_counts(root)
    if not counts:
        raise Skip(f"no EDAC memory controllers under {root} (no EDAC driver for this platform)")
    limit = config["edac_ue_max"]
    before = read_json_state(config, EDAC_STATE).get("ue", {})
    dimms = dimm_counts(root)
    seen: list[dict[str, Any]] = []
    for mc, (ue, _) in counts.items():
        last = before.get(mc)
        new = ue > limit if not isinstance(last, int) or ue < last else ue > last
        if new:
            failing = [f"{label} ({n})" for label, n, _ in dimms.get(mc, []) if n > 0]
            where = f" on {', '.join(failing)}" if failing else ""
            message = f"{mc}: {ue} uncorrectable memory errors (max {limit}){where}"
            seen.append({"check": "edac", "key": f"edac {mc} {ue}", "message": message})
    write_json_state(config, EDAC_STATE, {"ue": {mc: ue for mc, (ue, _) in counts.items()}})
    text, window = kernel_log(node)
    for mc, count, what, dimm in logged_ue(text):
        message = f"{mc}: {count} uncorrectable {what} logged by the kernel{f' on {dimm}' if dimm else ''}"
        seen.append({"check": "edac", "key": f"edac log {mc} {dimm or what}", "message": message})
    kept = keep(config, "edac", seen)
    if kept:
        shown = summarize([r["message"] for r in kept], 2)
        raise CheckFailed(f"{shown} [kept since {when(kept[0]['since'])} until corectl heal or corectl resume]")
    corrected = sum(ce for _, ce in counts.values())
    return (
        f"no uncorrectable memory errors on {len(counts)} memory controllers ({corrected} corrected), "
        f"none logged in the last {window} s"
    )

"""Host memory: uncorrectable errors the memory controllers counted (EDAC)."""

from __future__ import annotations

from pathlib import Path

from .core import CheckFailed, Node, Skip, _read, summarize
from .sticky import keep, read_json_state, when, write_json_state


def edac_counts(root: Path) -> dict[str, tuple[int, int]]:
    """Memory controller -> (uncorrectable, correctable) errors, from <root>/mc*/{ue,ce}_count."""
    found = {}
    for controller in sorted(root.glob("mc[0-9]*")):
        ue, ce = _read(controller / "ue_count"), _read(controller / "ce_count")
        if ue.isdigit() and ce.isdigit():
            found[controller.name] = (int(ue), int(ce))
    return found


EDAC_STATE = "edac-counts.json"


def check_edac(node: Node) -> str:
    """Uncorrectable host memory errors (EDAC): a count above edac_ue_max when first seen, or one that grew
    since the last run, fails the node and is kept (the kernel's counts start from 0 at a boot; the DIMM is
    no better for it). A count already judged and ended by heal or an operator is not judged again until it
    grows. Correctable errors are counted in the message."""
    config = node.config
    root = Path(config["edac_sysfs_root"])
    counts = edac_counts(root)
    if not counts:
        raise Skip(f"no EDAC memory controllers under {root} (no EDAC driver for this platform)")
    limit = config["edac_ue_max"]
    before = read_json_state(config, EDAC_STATE).get("ue", {})
    seen = []
    for mc, (ue, _) in counts.items():
        last = before.get(mc)
        new = ue > limit if not isinstance(last, int) or ue < last else ue > last
        if new:
            message = f"{mc}: {ue} uncorrectable memory errors (max {limit})"
            seen.append({"check": "edac", "key": f"edac {mc} {ue}", "message": message})
    write_json_state(config, EDAC_STATE, {"ue": {mc: ue for mc, (ue, _) in counts.items()}})
    kept = keep(config, "edac", seen)
    if kept:
        shown = summarize([r["message"] for r in kept], 2)
        raise CheckFailed(f"{shown} [kept since {when(kept[0]['since'])} until corectl heal or corectl resume]")
    corrected = sum(ce for _, ce in counts.values())
    return f"no uncorrectable memory errors on {len(counts)} memory controllers ({corrected} corrected)"

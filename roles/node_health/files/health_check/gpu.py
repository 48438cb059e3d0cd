"""GPU checks read from nvidia-smi: driver version, GPU count and model, persistence, ECC and row
remapping, temperature, clock throttling."""

from __future__ import annotations

from pathlib import Path

from .core import THROTTLE_BITS, CheckFailed, Node, Skip, _read, gpu_label, needs_gpus, summarize


def check_driver_version(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    loaded = node.driver()
    want = config["driver_version"]
    if want and loaded != want:
        raise CheckFailed(f"driver {loaded} loaded, expected {want}")
    return f"driver {loaded}" + ("" if want else " (no expected version set)")


def pci_gpus(root: str = "/sys/bus/pci/devices") -> set[str]:
    """PCI addresses (0000:18:00.0) of NVIDIA 3D controllers: GPUs the kernel sees, driver or not."""
    found = set()
    for device in Path(root).glob("*"):
        if _read(device / "vendor") == "0x10de" and _read(device / "class").startswith("0x0302"):
            found.add(device.name.lower())
    return found


def check_gpu_count(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    rows = node.query(["index", "name", "pci.bus_id"])
    want, model = config["gpu_count"], config["gpu_model"]
    if len(rows) != want:
        missing = pci_gpus() - {r["pci.bus_id"][-12:].lower() for r in rows}
        hint = f" (on PCI but not in nvidia-smi: {', '.join(sorted(missing))})" if missing else ""
        raise CheckFailed(f"{len(rows)} of {want} GPUs visible to nvidia-smi{hint}")
    if model:
        wrong = [f"{gpu_label(r)} is {r['name']}" for r in rows if model.lower() not in r["name"].lower()]
        if wrong:
            raise CheckFailed(f"expected {model}: {summarize(wrong)}")
    names = sorted({r["name"] for r in rows})
    return f"{len(rows)} x {', '.join(names)}"


def check_persistence(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    if not config["persistence"]:
        raise Skip("persistence mode not required")
    rows = node.query(["index", "persistence_mode"])
    off = [gpu_label(r) for r in rows if r["persistence_mode"] != "Enabled"]
    if off:
        raise CheckFailed(f"persistence mode off on {', '.join(off)}")
    return f"persistence mode on for {len(rows)} GPUs"


def _number(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def check_ecc(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    fields = [
        "index",
        "ecc.errors.uncorrected.volatile.total",
        "remapped_rows.pending",
        "remapped_rows.failure",
        "retired_pages.pending",
    ]
    limit = config["ecc_volatile_uncorrected_max"]
    problems = []
    for row in node.query(fields):
        found = []
        errors = _number(row["ecc.errors.uncorrected.volatile.total"])
        if errors is not None and errors > limit:
            found.append(f"{errors} volatile uncorrectable ECC error(s) (max {limit})")
        if row["remapped_rows.pending"] == "Yes":
            found.append("row remap pending (reset the GPU)")
        if row["remapped_rows.failure"] == "Yes":
            found.append("row remapping failure (replace the GPU)")
        if row["retired_pages.pending"] == "Yes":
            found.append("page retirement pending")
        if found:
            problems.append(f"{gpu_label(row)}: {', '.join(found)}")
    if problems:
        raise CheckFailed(summarize(problems, 2))
    return "no uncorrectable ECC errors, no pending or failed row remaps"


def check_temperature(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    limit = config["max_temperature"]
    rows = node.query(["index", "temperature.gpu"])
    hot = [
        f"{gpu_label(r)} at {r['temperature.gpu']} C"
        for r in rows
        if _number(r["temperature.gpu"]) is not None and int(r["temperature.gpu"]) > limit
    ]
    if hot:
        raise CheckFailed(f"{summarize(hot)} (max {limit} C)")
    hottest = max((int(r["temperature.gpu"]) for r in rows if _number(r["temperature.gpu"]) is not None), default=0)
    return f"hottest GPU {hottest} C (max {limit} C)"


def active_reasons(mask: int) -> list[str]:
    return [name for name, bit in THROTTLE_BITS.items() if mask & bit]


def check_throttle(node: Node) -> str:
    config = node.config
    needs_gpus(config)
    watched = config["throttle_reasons"]
    if not watched:
        raise Skip("no throttle reasons watched")
    field = "clocks_event_reasons.active"
    try:
        rows = node.query(["index", field])
    except CheckFailed:  # drivers before 535 know only the older name
        field = "clocks_throttle_reasons.active"
        rows = node.query(["index", field])
    problems = []
    for row in rows:
        try:
            mask = int(row[field], 16)
        except ValueError:
            continue
        bad = [reason for reason in active_reasons(mask) if reason in watched]
        if bad:
            problems.append(f"{gpu_label(row)} {'+'.join(bad)}")
    if problems:
        raise CheckFailed(f"clocks throttled: {summarize(problems)}")
    return f"no {'/'.join(watched)} on {len(rows)} GPUs"

"""GPU checks read from nvidia-smi: driver version, GPU count and model, persistence, ECC and row
remapping, temperature (the GPU's and its HBM's), clock throttling, the PCIe link."""

from __future__ import annotations

from pathlib import Path

from .core import THROTTLE_BITS, CheckFailed, Node, Skip, _read, bus_key, gpu_label, needs_gpus, summarize


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
    # HBM: nvidia-smi -q's "Memory Current Temp" ("N/A" where the GPU does not report it)
    memory_limit = config["max_memory_temperature"]
    memory = [(label, _celsius(gpu.get("Temperature/Memory Current Temp", ""))) for label, gpu in q_labels(node)]
    hot_memory = [
        f"{label} memory at {degrees} C" for label, degrees in memory if degrees is not None and degrees > memory_limit
    ]
    if hot_memory:
        raise CheckFailed(f"{summarize(hot_memory)} (max {memory_limit} C)")
    read = [degrees for _, degrees in memory if degrees is not None]
    memory_text = (
        f", hottest memory {max(read)} C (max {memory_limit} C)" if read else ", memory temperature not reported"
    )
    return f"hottest GPU {hottest} C (max {limit} C){memory_text}"


def _celsius(text: str) -> int | None:
    number = text.removesuffix(" C").strip()
    return int(number) if number.lstrip("-").isdigit() else None


def q_labels(node: Node) -> list[tuple[str, dict[str, str]]]:
    """Each GPU of `nvidia-smi -q` with the name every other message uses: "GPU <index>", the index of
    --query-gpu, `nvidia-smi -L` and CUDA_VISIBLE_DEVICES, found by its bus id (its position in the report where
    the query does not list it). Never -q's "Minor Number": that is the GPU's /dev/nvidia<N>, which need not be
    its index."""
    try:
        index = {bus_key(row["pci.bus_id"]): row["index"] for row in node.query(["index", "pci.bus_id"])}
    except CheckFailed:  # the query's own checks say why; the report's order is the index order
        index = {}
    return [(f"GPU {index.get(bus_key(gpu.get('GPU', '')), n)}", gpu) for n, gpu in enumerate(node.q())]


def _link(gpu: dict[str, str], what: str) -> int | None:
    """A PCIe link value of `nvidia-smi -q` ("16x", "5") as a number; None where not reported."""
    text = gpu.get(f"PCI/GPU Link Info/{what}", "").removesuffix("x").strip()
    return int(text) if text.isdigit() else None


def check_pcie(node: Node) -> str:
    """Each GPU's PCIe link at its maximum generation and width, judged only where the GPU is
    busy (an idle GPU lowers its link to save power; a link message says "while busy"), and its replay
    counter, judged busy or idle."""
    config = node.config
    needs_gpus(config)
    replay_max = config["pcie_replay_max"]
    problems, idle, judged = [], [], 0
    for label, gpu in q_labels(node):
        replays = gpu.get("PCI/Replays Since Reset", "")
        if replays.isdigit() and int(replays) > replay_max:
            problems.append(f"{label} {replays} PCIe replays (max {replay_max})")
        reasons = "Clocks Event Reasons" if "Clocks Event Reasons/Idle" in gpu else "Clocks Throttle Reasons"
        if gpu.get(f"{reasons}/Idle") == "Active":
            idle.append(label)
            continue
        gen, gen_max = _link(gpu, "PCIe Generation/Current"), _link(gpu, "PCIe Generation/Max")
        width, width_max = _link(gpu, "Link Width/Current"), _link(gpu, "Link Width/Max")
        if None in (gen, gen_max, width, width_max):
            continue
        judged += 1
        if width is not None and width_max is not None and width < width_max:
            problems.append(f"{label} PCIe x{width} of x{width_max} while busy")
        if gen is not None and gen_max is not None and gen < gen_max:
            problems.append(f"{label} PCIe Gen{gen} of Gen{gen_max} while busy")
    if problems:
        raise CheckFailed(summarize(problems))
    note = f"; {len(idle)} idle GPUs not judged (an idle GPU lowers its link)" if idle else ""
    return f"{judged} busy GPUs at their maximum PCIe link, replays <= {replay_max}{note}"


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

#!/usr/bin/python3
"""Stand-in for nvidia-smi over the simulated GPUs (installed as /usr/bin/nvidia-smi).

Supported: plain table, -L, -q [-i ID], --query-gpu=F,... --format=csv[,noheader][,nounits] [-i ID],
--query-compute-apps=F,... --format=csv[,noheader][,nounits] [-i ID] (processes from `gpu-sim attach`),
-pm 0|1 [-i ID], -r/--gpu-reset, nvlink -s|--status|-e [-i ID], topo -m.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

if TYPE_CHECKING:  # annotations only: a tool started on every health check imports no more than it runs
    from typing import Any

Gpu = dict[str, "Any"]  # (a string: Any is imported for type checkers only)
State = dict[str, "Any"]


def _yes(value: object) -> str:
    return "Yes" if value else "No"


def _enabled(value: object) -> str:
    return "Enabled" if value else "Disabled"


def _mask(gpu: Gpu) -> str:
    return f"0x{gpusim.throttle_mask(gpu.get('throttle_reasons', [])):016x}"


# field name -> (header, unit, value(state, gpu, driver))
FieldFn = Callable[[State, Gpu, str], object]
FIELDS: dict[str, tuple[str, str, FieldFn]] = {
    "count": ("count", "", lambda s, g, d: len(gpusim.present_gpus(s))),
    "index": ("index", "", lambda s, g, d: g["index"]),
    "name": ("name", "", lambda s, g, d: s["model"]),
    "gpu_name": ("name", "", lambda s, g, d: s["model"]),
    "uuid": ("uuid", "", lambda s, g, d: g["uuid"]),
    "gpu_uuid": ("uuid", "", lambda s, g, d: g["uuid"]),
    "serial": ("serial", "", lambda s, g, d: f"165422{g['index']:07d}"),
    "pci.bus_id": ("pci.bus_id", "", lambda s, g, d: g["pci_bus_id"]),
    "gpu_bus_id": ("pci.bus_id", "", lambda s, g, d: g["pci_bus_id"]),
    "driver_version": ("driver_version", "", lambda s, g, d: d),
    "pstate": ("pstate", "", lambda s, g, d: "P0"),
    "temperature.gpu": ("temperature.gpu", "", lambda s, g, d: g["temperature_c"]),
    "power.draw": ("power.draw", "W", lambda s, g, d: f"{float(g['power_w']):.2f}"),
    "power.limit": ("power.limit", "W", lambda s, g, d: "700.00"),
    "memory.total": ("memory.total", "MiB", lambda s, g, d: s["memory_total_mib"]),
    "memory.used": ("memory.used", "MiB", lambda s, g, d: 0),
    "memory.free": ("memory.free", "MiB", lambda s, g, d: s["memory_total_mib"]),
    "utilization.gpu": ("utilization.gpu", "%", lambda s, g, d: 0),
    "utilization.memory": ("utilization.memory", "%", lambda s, g, d: 0),
    "persistence_mode": ("persistence_mode", "", lambda s, g, d: _enabled(g.get("persistence_mode"))),
    "compute_mode": ("compute_mode", "", lambda s, g, d: "Default"),
    "ecc.mode.current": ("ecc.mode.current", "", lambda s, g, d: "Enabled"),
    "ecc.errors.uncorrected.volatile.total": (
        "ecc.errors.uncorrected.volatile.total",
        "",
        lambda s, g, d: g["ecc"]["volatile_uncorrected"],
    ),
    "ecc.errors.uncorrected.aggregate.total": (
        "ecc.errors.uncorrected.aggregate.total",
        "",
        lambda s, g, d: g["ecc"]["aggregate_uncorrected"],
    ),
    "ecc.errors.corrected.volatile.total": (
        "ecc.errors.corrected.volatile.total",
        "",
        lambda s, g, d: g["ecc"]["volatile_corrected"],
    ),
    "remapped_rows.pending": ("remapped_rows.pending", "", lambda s, g, d: _yes(g["ecc"]["remapped_rows_pending"])),
    "remapped_rows.failure": ("remapped_rows.failure", "", lambda s, g, d: _yes(g["ecc"]["remapped_rows_failure"])),
    "retired_pages.pending": ("retired_pages.pending", "", lambda s, g, d: _yes(g["ecc"]["retired_pages_pending"])),
    "clocks.sm": ("clocks.current.sm", "MHz", lambda s, g, d: g["sm_clock_mhz"]),
    "clocks.current.sm": ("clocks.current.sm", "MHz", lambda s, g, d: g["sm_clock_mhz"]),
    "clocks.max.sm": ("clocks.max.sm", "MHz", lambda s, g, d: 1980),
    "clocks_throttle_reasons.active": ("clocks_throttle_reasons.active", "", lambda s, g, d: _mask(g)),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", "", lambda s, g, d: _mask(g)),
    "fabric.state": ("fabric.state", "", lambda s, g, d: g["fabric"]["state"]),
    "fabric.status": ("fabric.status", "", lambda s, g, d: g["fabric"]["status"]),
}


def _select(state: State, ident: str | None) -> list[Gpu] | None:
    gpus = gpusim.present_gpus(state)
    if ident is None:
        return gpus
    chosen = []
    for part in ident.split(","):
        want = part.strip()
        matches = [
            g
            for g in gpus
            if want in (str(g["index"]), g["uuid"]) or want.upper() in (g["pci_bus_id"], g["pci_bus_id"][4:])
        ]
        if not matches:
            return None
        chosen.extend(matches)
    return chosen


def _no_such_gpu() -> int:
    print("No devices were found")
    return 6


def query_gpu(state: State, driver: str, fields_arg: str, fmt: str | None, ident: str | None) -> int:
    options = _csv_options(fmt, "query-gpu")
    if options is None:
        return 2
    names = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for name in names:
        if name.lower() not in FIELDS:
            print(f'Field "{name}" is not a valid field to query.')
            print()
            return 2
    gpus = _select(state, ident)
    if gpus is None:
        return _no_such_gpu()
    units = "nounits" not in options
    if "noheader" not in options:
        headers = []
        for name in names:
            header, unit, _fn = FIELDS[name.lower()]
            headers.append(f"{header} [{unit}]" if unit else header)
        print(", ".join(headers))
    for gpu in gpus:
        values = []
        for name in names:
            _header, unit, fn = FIELDS[name.lower()]
            value = str(fn(state, gpu, driver))
            if unit and units:
                value = f"{value} %" if unit == "%" else f"{value} {unit}"
            values.append(value)
        print(", ".join(values))
    return 0


# --query-compute-apps fields: (header, unit, value of one (GPU, process) pair)
APP_FIELDS: dict[str, tuple[str, str, Callable[[Gpu, dict[str, Any]], object]]] = {
    "pid": ("pid", "", lambda g, p: p["pid"]),
    "process_name": ("process_name", "", lambda g, p: p["name"]),
    "name": ("process_name", "", lambda g, p: p["name"]),
    "gpu_uuid": ("gpu_uuid", "", lambda g, p: g["uuid"]),
    "gpu_bus_id": ("gpu_bus_id", "", lambda g, p: g["pci_bus_id"]),
    "used_memory": ("used_gpu_memory", "MiB", lambda g, p: p.get("used_memory_mib", 0)),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda g, p: p.get("used_memory_mib", 0)),
}


def _csv_options(fmt: str | None, query: str) -> list[str] | None:
    """The --format options, or None after printing nvidia-smi's complaint."""
    if fmt is None:
        print(f'Missing format argument. Use "--format=csv" along with "--{query}".')
        return None
    options = [o.strip() for o in fmt.split(",")]
    if options[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in options):
        print(f'"{fmt}" is not a valid format. Supported: csv[,noheader][,nounits]')
        return None
    return options


def query_compute_apps(state: State, fields_arg: str, fmt: str | None, ident: str | None) -> int:
    options = _csv_options(fmt, "query-compute-apps")
    if options is None:
        return 2
    names = [f.strip().lower() for f in fields_arg.split(",") if f.strip()]
    for name in names:
        if name not in APP_FIELDS:
            print(f'Field "{name}" is not a valid field to query.')
            print()
            return 2
    gpus = _select(state, ident)
    if gpus is None:
        return _no_such_gpu()
    chosen = {g["index"] for g in gpus}
    if "noheader" not in options:
        print(", ".join(f"{h} [{u}]" if u else h for h, u, _fn in (APP_FIELDS[n] for n in names)))
    for gpu, proc in gpusim.compute_apps(state):
        if gpu["index"] not in chosen:
            continue
        values = []
        for name in names:
            _header, unit, fn = APP_FIELDS[name]
            value = str(fn(gpu, proc))
            values.append(f"{value} {unit}" if unit and "nounits" not in options else value)
        print(", ".join(values))
    return 0


def _row(label: str, value: object, indent: int = 4) -> str:
    """One `nvidia-smi -q` line: the ':' of every key-value line sits in column 42, whatever the
    nesting (tests/samples/nvidia-smi-q.h100-sxm.545.23.08.txt)."""
    if value == "":
        return f"{' ' * indent}{label}"
    return f"{' ' * indent}{label}".ljust(42) + f": {value}"


def query_report(state: State, driver: str, ident: str | None) -> int:
    gpus = _select(state, ident)
    if gpus is None:
        return _no_such_gpu()
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _row("Timestamp", time.strftime("%a %b %d %H:%M:%S %Y"), 0),
        _row("Driver Version", driver, 0),
        _row("CUDA Version", gpusim.cuda_version(driver), 0),
        "",
        _row("Attached GPUs", len(gpusim.present_gpus(state)), 0),
    ]
    for gpu in gpus:
        ecc = gpu["ecc"]
        mask = gpusim.throttle_mask(gpu.get("throttle_reasons", []))

        def active(bit: str, mask: int = mask) -> str:
            return "Active" if mask & gpusim.THROTTLE_BITS[bit] else "Not Active"

        pcie = {**gpusim.default_pcie(), **gpu.get("pcie", {})}  # a state file older than the PCIe fields
        lines += [
            f"GPU {gpu['pci_bus_id']}",
            _row("Product Name", state["model"]),
            _row("Product Brand", "NVIDIA"),
            _row("Product Architecture", "Hopper"),
            _row("Display Mode", "Disabled"),
            _row("Display Active", "Disabled"),
            _row("Persistence Mode", _enabled(gpu.get("persistence_mode"))),
            _row("Addressing Mode", "None"),
            _row("MIG Mode", ""),
            _row("Current", "Disabled", 8),
            _row("Pending", "Disabled", 8),
            _row("Accounting Mode", "Disabled"),
            _row("Driver Model", ""),
            _row("Current", "N/A", 8),
            _row("Pending", "N/A", 8),
            _row("Serial Number", f"165422{gpu['index']:07d}"),
            _row("GPU UUID", gpu["uuid"]),
            _row("Minor Number", gpu["index"]),
            _row("VBIOS Version", "96.00.99.00.01"),
            _row("MultiGPU Board", "No"),
            _row("Board ID", f"0x{int(gpu['pci_bus_id'][9:11], 16) << 8:x}"),
            _row("GPU Part Number", "2330-885-A1"),
            _row("Fabric", ""),
            _row("State", gpu["fabric"]["state"], 8),
            _row("Status", gpu["fabric"]["status"], 8),
            _row("CliqueId", "N/A", 8),
            _row("ClusterUUID", "N/A", 8),
            _row("PCI", ""),
            _row("Bus", f"0x{gpu['pci_bus_id'][9:11]}", 8),
            _row("Device", "0x00", 8),
            _row("Domain", "0x0000", 8),
            _row("Device Id", "0x233010DE", 8),
            _row("Bus Id", gpu["pci_bus_id"], 8),
            _row("GPU Link Info", "", 8),
            _row("PCIe Generation", "", 12),
            _row("Max", pcie["gen_max"], 16),
            _row("Current", pcie["gen"], 16),
            _row("Device Current", pcie["gen"], 16),
            _row("Device Max", pcie["gen_max"], 16),
            _row("Host Max", pcie["gen_max"], 16),
            _row("Link Width", "", 12),
            _row("Max", f"{pcie['width_max']}x", 16),
            _row("Current", f"{pcie['width']}x", 16),
            _row("Replays Since Reset", pcie["replays"], 8),
            _row("Replay Number Rollovers", 0, 8),
            _row("Clocks Event Reasons", ""),
            _row("Idle", active("GpuIdle"), 8),
            _row("SW Power Cap", active("SwPowerCap"), 8),
            _row("HW Slowdown", active("HwSlowdown"), 8),
            _row("SW Thermal Slowdown", active("SwThermalSlowdown"), 8),
            _row("HW Thermal Slowdown", active("HwThermalSlowdown"), 12),  # nested under HW Slowdown
            _row("HW Power Brake Slowdown", active("HwPowerBrakeSlowdown"), 12),
            _row("FB Memory Usage", ""),
            _row("Total", f"{state['memory_total_mib']} MiB", 8),
            _row("Reserved", "0 MiB", 8),
            _row("Used", "0 MiB", 8),
            _row("Free", f"{state['memory_total_mib']} MiB", 8),
            _row("Compute Mode", "Default"),
            _row("ECC Mode", ""),
            _row("Current", "Enabled", 8),
            _row("Pending", "Enabled", 8),
            _row("ECC Errors", ""),
            _row("Volatile", "", 8),
            _row("SRAM Correctable", 0, 12),
            _row("SRAM Uncorrectable", 0, 12),
            _row("DRAM Correctable", ecc["volatile_corrected"], 12),
            _row("DRAM Uncorrectable", ecc["volatile_uncorrected"], 12),
            _row("Aggregate", "", 8),
            _row("SRAM Correctable", 0, 12),
            _row("SRAM Uncorrectable", 0, 12),
            _row("DRAM Correctable", 0, 12),
            _row("DRAM Uncorrectable", ecc["aggregate_uncorrected"], 12),
            _row("Retired Pages", ""),
            _row("Pending Page Blacklist", _yes(ecc["retired_pages_pending"]), 8),
            _row("Remapped Rows", ""),
            _row("Correctable Error", 0, 8),
            _row("Uncorrectable Error", ecc["aggregate_uncorrected"], 8),
            _row("Pending", _yes(ecc["remapped_rows_pending"]), 8),
            _row("Remapping Failure Occurred", _yes(ecc["remapped_rows_failure"]), 8),
            _row("Temperature", ""),
            _row("GPU Current Temp", f"{gpu['temperature_c']} C", 8),
            _row("GPU Shutdown Temp", "92 C", 8),
            _row("GPU Slowdown Temp", "89 C", 8),
            _row("Memory Current Temp", f"{gpusim.memory_temperature(gpu)} C", 8),
            _row("GPU Power Readings", ""),
            _row("Power Draw", f"{float(gpu['power_w']):.2f} W", 8),
            _row("Current Power Limit", "700.00 W", 8),
            _row("Clocks", ""),
            _row("SM", f"{gpu['sm_clock_mhz']} MHz", 8),
            _row("Processes", "None"),
            "",
        ]
    print("\n".join(lines))
    return 0


def list_gpus(state: State) -> int:
    for gpu in gpusim.present_gpus(state):
        print(f"GPU {gpu['index']}: {state['model']} (UUID: {gpu['uuid']})")
    return 0


def persistence(value: str, ident: str | None) -> int:
    if value not in ("0", "1", "ENABLED", "DISABLED"):
        print(f'Invalid value "{value}" for persistence mode: use 0/DISABLED or 1/ENABLED.')
        return 2
    enable = value in ("1", "ENABLED")
    changed: list[str] = []

    def apply(state: State) -> None:
        gpus = _select(state, ident) or []
        for gpu in gpus:
            gpu["persistence_mode"] = enable
            changed.append(gpu["pci_bus_id"])

    gpusim.update(apply)
    if not changed:
        return _no_such_gpu()
    for bus in changed:
        print(f"{'Enabled' if enable else 'Disabled'} persistence mode for GPU {bus}.")
    print("All done.")
    return 0


def nvlink(state: State, args: list[str]) -> int:
    ident = _option(args, "-i", "--id")
    gpus = _select(state, ident)
    if gpus is None:
        return _no_such_gpu()
    errors = "-e" in args or "--errorcounters" in args
    if not errors and not ("-s" in args or "--status" in args):
        print("NVLINK -- Display NvLink information.\n\n    -s,  --status    Display NvLink status.")
        print("    -e,  --errorcounters  Display error counters.")
        return 0
    for gpu in gpus:
        print(f"GPU {gpu['index']}: {state['model']} (UUID: {gpu['uuid']})")
        for number, link in enumerate(gpu["nvlinks"]):
            if errors:
                print(f"\t Link {number}: Replay Errors: {link['replay_errors']}")
                print(f"\t Link {number}: Recovery Errors: {link['recovery_errors']}")
                print(f"\t Link {number}: CRC Errors: {link['crc_errors']}")
                print()  # a blank line after each link's counters, as the real tool prints
            elif link["state"] == "up":
                print(f"\t Link {number}: {link['speed_gbps']} GB/s")
            else:
                print(f"\t Link {number}: <inactive>")
    return 0


def topo(state: State, args: list[str]) -> int:
    if "-m" not in args and "--matrix" not in args:
        print("topo -- Display topological information about the system.")
        print("\n    -m, --matrix    Display the GPUDirect matrix.")
        return 0
    gpus = gpusim.present_gpus(state)
    nics = state.get("ib_ports", [])
    names = [f"GPU{g['index']}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    print("\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
    half = max(1, (len(gpus) + 1) // 2)
    for row, gpu in enumerate(gpus):
        link = "NV18" if state.get("nvswitch") else "SYS"
        cells = [" X " if col == row else link for col in range(len(gpus))]
        cells += [
            "PIX" if i == gpu["index"] else ("NODE" if (i < half) == (row < half) else "SYS") for i in range(len(nics))
        ]
        numa = 0 if row < half else 1
        affinity = "0-55,112-167" if numa == 0 else "56-111,168-223"
        print(f"GPU{gpu['index']}\t" + "\t".join(cells) + f"\t{affinity}\t{numa}\t\tN/A")
    for i in range(len(nics)):
        cells = [
            "PIX" if i == g["index"] else ("NODE" if (i < half) == (r < half) else "SYS") for r, g in enumerate(gpus)
        ]
        cells += [" X " if j == i else ("NODE" if (i < half) == (j < half) else "SYS") for j in range(len(nics))]
        print(f"NIC{i}\t" + "\t".join(cells))
    print(
        "\nLegend:\n\n  X    = Self"
        "\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes"
        "\n  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"
        "\n  PIX  = Connection traversing at most a single PCIe bridge"
        "\n  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n"
    )
    for i, port in enumerate(nics):
        print(f"  NIC{i}: {port['device']}")
    return 0


def summary(state: State, driver: str) -> int:
    width = 91
    rule = "+" + "-" * (width - 2) + "+"
    head = (
        f"NVIDIA-SMI {driver}".ljust(32)
        + f"Driver Version: {driver}".ljust(30)
        + f"CUDA Version: {gpusim.cuda_version(driver)}"
    )
    print(time.strftime("%a %b %d %H:%M:%S %Y"))
    print(rule)
    print(f"| {head.ljust(width - 4)} |")
    print("|-----------------------------------------+------------------------+----------------------+")
    print("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
    print("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
    print("|=========================================+========================+======================|")
    short = state["model"].replace("NVIDIA ", "")[:20]
    for gpu in gpusim.present_gpus(state):
        pm = "On" if gpu.get("persistence_mode") else "Off"
        ecc = gpu["ecc"]["volatile_uncorrected"]
        line1 = f"| {gpu['index']:>3}  {short:<20}{pm:>14} | {gpu['pci_bus_id'] + ' Off':>22} | {ecc:>20} |"
        power = f"{round(float(gpu['power_w']))}W /  700W"
        memory = f"0MiB / {state['memory_total_mib']}MiB"
        line2 = f"| N/A   {gpu['temperature_c']:>2}C    P0{power:>24} | {memory:>22} |      0%      Default |"
        print(line1)
        print(line2)
        print("+-----------------------------------------+------------------------+----------------------+")
    print()
    print(rule)
    print("| Processes:".ljust(width - 1) + "|")
    print("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |")
    print("|=========================================================================================|")
    apps = gpusim.compute_apps(state)
    for gpu, proc in apps:
        name = str(proc["name"])
        name = name if len(name) <= 35 else "..." + name[-32:]
        memory = f"{proc.get('used_memory_mib', 0)}MiB"
        print(f"|  {gpu['index']:>3}   N/A  N/A  {proc['pid']:>15}      C   {name:<35}{memory:>10} |")
    if not apps:
        print("|  No running processes found".ljust(width - 1) + "|")
    print(rule)
    return 0


def _option(args: list[str], short: str, long: str) -> str | None:
    for pos, arg in enumerate(args):
        if arg in (short, long) and pos + 1 < len(args):
            return args[pos + 1]
        if arg.startswith(long + "="):
            return arg.split("=", 1)[1]
        if arg.startswith(short) and len(arg) > len(short) and not arg.startswith("--"):
            return arg[len(short) :].lstrip("=")
    return None


def gpu_reset(state: dict[str, Any], ident: str | None) -> int:
    """``-r``: like the real tool, refused while a client holds the GPUs (on NVSwitch boards all reset
    together); a reset clears volatile ECC counts, applies pending row remaps and retrains NVLinks."""
    clients = gpusim.gpu_clients(state)
    if any(gpu.get("persistence_mode") for gpu in state["gpus"]):
        clients.append("nvidia-persistenced")
    if clients:
        print(f"Unable to reset GPU: the GPU is in use by another client ({', '.join(clients)}).")
        return 255
    if ident is not None and state.get("nvswitch", True):
        print("Resetting a single GPU is not supported on this system: reset all GPUs together.")
        return 3

    def reset(current: dict[str, Any]) -> None:
        for gpu in current["gpus"]:
            if not gpu.get("present", True):
                continue
            ecc = gpu["ecc"]
            ecc["volatile_uncorrected"] = ecc["volatile_corrected"] = 0
            ecc["remapped_rows_pending"] = 0
            gpu["nvlinks"] = [gpusim.default_nvlink() for _ in gpu["nvlinks"]]

    updated = gpusim.update(reset)
    for gpu in updated["gpus"]:
        if gpu.get("present", True):
            print(f"GPU {gpu['pci_bus_id']} was successfully reset.")
    print("All done.")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    state = gpusim.load_or_none()
    code, message = gpusim.driver_check(state)
    if code:
        print(message)
        return code
    assert state is not None
    driver = state["loaded_driver"]
    if args[:1] == ["nvlink"]:
        return nvlink(state, args[1:])
    if args[:1] == ["topo"]:
        return topo(state, args[1:])
    ident = _option(args, "-i", "--id")
    apps = _option(args, "--query-compute-apps", "--query-compute-apps")
    if apps is not None:
        return query_compute_apps(state, apps, _option(args, "--format", "--format"), ident)
    query = _option(args, "--query-gpu", "--query-gpu")
    if query is not None:
        return query_gpu(state, driver, query, _option(args, "--format", "--format"), ident)
    pm = _option(args, "-pm", "--persistence-mode")
    if pm is not None:
        return persistence(pm.upper(), ident)
    if "-r" in args or "--gpu-reset" in args:
        return gpu_reset(state, ident)
    if "-L" in args or "--list-gpus" in args:
        return list_gpus(state)
    if "-q" in args or "--query" in args:
        return query_report(state, driver, ident)
    if not args:
        return summary(state, driver)
    print(f"Invalid combination of input arguments: {' '.join(args)}. Please run 'nvidia-smi -h' for help.")
    return 2


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())

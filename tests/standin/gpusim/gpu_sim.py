#!/usr/bin/python3
"""gpu-sim: test-side control of the simulated GPUs (installed as /usr/bin/gpu-sim).

gpu-sim init [--gpus 8] [--model M] [--no-nvswitch] [--hostname H] [--force]
gpu-sim show
gpu-sim set <dotted.path> <json-or-string>       e.g. gpu-sim set gpus.3.temperature_c 95
gpu-sim fault <name> [--gpu N] [--xid N] [--link N] [--device mlx5_N|nvmeN]
                        (ib-errors, ib-flap: a port's counters grow; they fall back to 0 only at a boot)
gpu-sim clear [<name>|all] [--gpu N] [--device mlx5_N]
gpu-sim reload          simulate unloading and loading the nvidia kernel module
gpu-sim boot            what a boot does (run by gpu-sim-boot.service); after a power-on
                        (the BMC stand-in's mark) GPUs that fell off the bus come back; the loaded
                        kernel modules become those of /etc/modules-load.d/*.conf
gpu-sim driver-installed  driver package postinst: load the driver if none is loaded yet
gpu-sim kernel-log [--since SECONDS]  the XID events as the kernel logs them (journalctl -k -o cat); each
                        is also sent to the node's journal as a kernel line when it happens (fault xid);
                        and the kernel lines the persistent journal kept through boots (fault edac-ue-logged)
gpu-sim nvme-smart-log /dev/nvmeN  a drive's SMART log as `nvme smart-log -o json` prints it
gpu-sim modprobe NAME   load a kernel module: add it to the stand-in's /proc/modules (GPU_SIM_MODULES)
gpu-sim rmmod NAME      unload it; a boot loads only what /etc/modules-load.d/*.conf names
gpu-sim attach --gpu N --pid PID [--memory MIB] [--stuck]
                        PID holds GPU N (nvidia-smi --query-compute-apps lists it while it runs;
                        --stuck: also after it is gone, as a context the driver failed to release)
gpu-sim detach [--pid PID]  forget PID's GPU contexts (all of them without --pid)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

if TYPE_CHECKING:  # annotations only: a tool started on every health check imports no more than it runs
    from typing import Any

# lost-gpu: fallen off the bus, back after a cold start (power off and on); dead-gpu: never back
# pcie-narrow: the link trained at x8 of x16 (while busy); hbm-hot: its memory at 100 C; ib-errors: 1,000
# symbol errors more on a port; ib-flap: its link went down twice and came back; edac-ue: an uncorrectable
# host memory error on memory controller mc1; nvme-missing: a drive left the bus (--device nvme9); nvme-warning:
# a drive's SMART critical warning "reliability degraded" (--device nvme3); nccl-slow: NCCL all_reduce at a
# quarter of its bus bandwidth (a degraded NVLink or GPU: what burn-in and validation catch); diag-slow: dcgmi
# diag takes DIAG_SLOW_S, as a long diagnostic does on real GPUs (a job running it can then be preempted);
# ib-slow: a port (--device) stays ACTIVE at its rate but carries a quarter of it (a bad cable: ib_write_bw sees it)
# ib-saturated: a port's link_downed counter at its 8-bit maximum, 255 (a real ConnectX-7 port's, tests/samples);
# edac-ue-logged: the kernel logged an uncorrectable memory error (Intel skx's line, tests/samples) into the node's
# persistent journal, which keeps it through a boot while EDAC's counts start from 0 (the node crashed of it);
# dcgm-pcie-replay, dcgm-dbe: what DCGM's health watches report for a GPU (a Warning, a Failure: gpusim.DCGM_HEALTH)
FAULTS = (
    "lost-gpu", "dead-gpu", "ecc", "xid", "nvlink-down", "hot", "ib-down", "throttle", "pcie-narrow", "hbm-hot",
    "ib-errors", "ib-flap", "edac-ue", "nvme-missing", "nvme-warning", "nccl-slow", "diag-slow", "ib-slow",
    "ib-saturated", "edac-ue-logged", "dcgm-pcie-replay", "dcgm-dbe",
)  # fmt: skip
# the EDAC core's line for an uncorrectable error as Intel's skx/i10nm drivers print it (tests/samples/dmesg-edac-*)
EDAC_UE_LINE = (
    "EDAC MC1: 1 UE memory read error on CPU_SrcID#0_MC#1_Chan#0_DIMM#0 (channel:0 slot:0 page:0x7e025e offset:0x400"
    " grain:32 -  err_code:0x00a0:0x0090  SystemAddress:0x7e025e400 ProcessorSocketId:0x0 MemoryControllerId:0x1)"
)
DIAG_SLOW_S = 900
NVME_FAULT_DRIVE = {"nvme-missing": "nvme9", "nvme-warning": "nvme3"}


def _die(message: str, code: int = 1) -> int:
    print(f"gpu-sim: {message}", file=sys.stderr)
    return code


def cmd_init(args: argparse.Namespace) -> int:
    if gpusim.exists() and not args.force:
        state = gpusim.load()
        print(f"gpu-sim: description exists at {gpusim.state_path()} (use --force to recreate)")
    else:
        state = gpusim.new_state(args.hostname, args.gpus, args.model, not args.no_nvswitch)
        with gpusim.locked():
            gpusim.save(state)
        print(f"gpu-sim: {args.gpus} x {args.model} described in {gpusim.state_path()}")
    gpusim.write_sysfs(state)
    gpusim.make_devices(len(state["gpus"]))
    return 0


def cmd_show(_args: argparse.Namespace) -> int:
    print(json.dumps(gpusim.load(), indent=2))
    return 0


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def set_path(state: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node: Any = state
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            try:
                index = int(part)
                node[index]  # raises IndexError for a bad index
            except (ValueError, IndexError):
                raise KeyError(f"{'.'.join(parts[: depth + 1])}: no such list item") from None
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            elif part not in node:
                raise KeyError(f"{'.'.join(parts[: depth + 1])}: no such key")
            else:
                node = node[part]
        else:
            raise KeyError(f"{'.'.join(parts[:depth])} is not an object or list")


def cmd_set(args: argparse.Namespace) -> int:
    value = _parse_value(args.value)
    try:
        gpusim.update(lambda state: set_path(state, args.path, value))
    except KeyError as exc:
        return _die(str(exc.args[0]))
    return 0


def _gpu(state: dict[str, Any], index: int) -> dict[str, Any]:
    for gpu in state["gpus"]:
        if gpu["index"] == index:
            return gpu
    raise KeyError(f"no GPU {index}")


def _ib(state: dict[str, Any], device: str) -> dict[str, Any]:
    for port in state["ib_ports"]:
        if port["device"] == device:
            return port
    raise KeyError(f"no IB device {device}")


def _nvme(state: dict[str, Any], device: str) -> str:
    if device not in [f"nvme{n}" for n in range(int(state.get("nvme_drives", gpusim.NVME_DRIVES)))]:
        raise KeyError(f"no NVMe drive {device}")
    return device


def inject(state: dict[str, Any], name: str, args: argparse.Namespace) -> None:
    if name == "nccl-slow":
        state["nccl_busbw_gbps"] = gpusim.NCCL_BUSBW_GBPS / 4
        return
    if name == "diag-slow":
        state["diag_seconds"] = DIAG_SLOW_S
        return
    if name in NVME_FAULT_DRIVE:
        device = _nvme(state, args.device or NVME_FAULT_DRIVE[name])
        nvme = state.setdefault("nvme", {})
        if name == "nvme-missing":
            nvme["missing"] = sorted({*nvme.get("missing", []), device})
        else:
            nvme.setdefault("warnings", {})[device] = 0x04  # reliability degraded
        return
    args.device = args.device or "mlx5_0"
    if name == "ib-down":
        _ib(state, args.device)["state"] = "DOWN"
        return
    if name == "ib-slow":
        port = _ib(state, args.device)
        port["write_bw_gbps"] = round(float(port.get("rate_gbps", gpusim.IB_RATE_GBPS)) * 0.981 / 4, 2)
        return
    if name == "edac-ue":  # the kernel's count: it grows until a boot
        counts = state.setdefault("edac", {}).setdefault("mc1", {})
        counts["ue_count"] = int(counts.get("ue_count", 0)) + 1
        return
    if name == "edac-ue-logged":  # kept by the persistent journal through boots (until cleared)
        state.setdefault("journal", []).append({"time": int(time.time()), "line": EDAC_UE_LINE})
        return
    if name == "ib-saturated":
        _ib(state, args.device).setdefault("counters", {})["link_downed"] = 255
        return
    if name in ("ib-errors", "ib-flap"):  # counters only grow (a reboot or a counter reset zeroes them)
        counters = _ib(state, args.device).setdefault("counters", {})
        counter, more = ("symbol_error", 1000) if name == "ib-errors" else ("link_downed", 2)
        counters[counter] = int(counters.get(counter, 0)) + more
        return
    gpu = _gpu(state, args.gpu)
    if name in ("lost-gpu", "dead-gpu"):
        gpu["present"] = False
        gpu["dead"] = name == "dead-gpu"
    elif name == "ecc":
        ecc = gpu["ecc"]
        ecc["volatile_uncorrected"] = max(1, ecc["volatile_uncorrected"])
        ecc["aggregate_uncorrected"] = max(1, ecc["aggregate_uncorrected"])
        ecc["remapped_rows_pending"] = 1
    elif name == "xid":
        message = gpusim.XID_MESSAGES.get(args.xid, "Unknown XID")
        gpu["xid_events"].append({"xid": args.xid, "time": int(time.time()), "message": message})
    elif name == "nvlink-down":
        if not 0 <= args.link < len(gpu["nvlinks"]):
            raise KeyError(f"GPU {args.gpu} has no NVLink {args.link}")
        gpu["nvlinks"][args.link]["state"] = "down"
    elif name in gpusim.DCGM_HEALTH:
        gpu["dcgm_health"] = sorted({*gpu.get("dcgm_health", []), name})
    elif name == "hot":
        gpu["temperature_c"] = 95
    elif name == "pcie-narrow":
        gpu["pcie"] = {**gpusim.default_pcie(), **gpu.get("pcie", {}), "width": 8}
    elif name == "hbm-hot":
        gpu["memory_temperature_c"] = 100
    elif name == "throttle":
        gpu["throttle_reasons"] = ["HwSlowdown"]


def repair(state: dict[str, Any], name: str, args: argparse.Namespace) -> None:
    if name in ("edac-ue-logged", "all"):
        state.pop("journal", None)
    if name in ("nccl-slow", "all"):
        state.pop("nccl_busbw_gbps", None)
    if name in ("diag-slow", "all"):
        state.pop("diag_seconds", None)
    nvme = state.get("nvme", {})  # the drive named by --device, or every drive
    if name in ("nvme-missing", "all"):
        nvme["missing"] = [d for d in nvme.get("missing", []) if args.device not in (None, d)]
    if name in ("nvme-warning", "all"):
        nvme["warnings"] = {d: w for d, w in nvme.get("warnings", {}).items() if args.device not in (None, d)}
    for port in state["ib_ports"]:
        if args.device in (None, port["device"]):
            if name in ("ib-down", "all"):
                port["state"] = "ACTIVE"
            if name in ("ib-slow", "all"):
                port.pop("write_bw_gbps", None)
            if name == "ib-saturated":  # (a counter reset: perfquery -R)
                port.get("counters", {}).pop("link_downed", None)
    gpus = state["gpus"] if args.gpu is None else [_gpu(state, args.gpu)]
    for gpu in gpus:
        if name in ("lost-gpu", "dead-gpu", "all"):
            gpu["present"] = True
            gpu.pop("dead", None)
        if name in ("ecc", "all"):
            gpu["ecc"] = gpusim.default_ecc()
        if name in ("xid", "all"):
            gpu["xid_events"] = []
        if name in ("nvlink-down", "all"):
            gpu["nvlinks"] = [gpusim.default_nvlink() for _ in gpu["nvlinks"]]
        if name in ("hot", "all"):
            gpu["temperature_c"] = gpusim.base_temperature(gpu["index"])
        if name in ("pcie-narrow", "all"):
            gpu["pcie"] = gpusim.default_pcie()
        if name in ("hbm-hot", "all"):
            gpu.pop("memory_temperature_c", None)
        if name in ("throttle", "all"):
            gpu["throttle_reasons"] = []
        if name in (*gpusim.DCGM_HEALTH, "all"):
            gpu["dcgm_health"] = [f for f in gpu.get("dcgm_health", []) if name not in (f, "all")]


def cmd_fault(args: argparse.Namespace) -> int:
    if args.gpu is None:
        args.gpu = 0
    try:
        state = gpusim.update(lambda state: inject(state, args.name, args))
    except KeyError as exc:
        return _die(str(exc.args[0]))
    if args.name == "xid":  # the kernel logs it as it happens
        gpu = _gpu(state, args.gpu)
        gpusim.log_kernel(kernel_xid_line(gpu, gpu["xid_events"][-1]))
    if args.name == "edac-ue-logged":
        gpusim.log_kernel(EDAC_UE_LINE)
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    try:
        gpusim.update(lambda state: repair(state, args.name, args))
    except KeyError as exc:
        return _die(str(exc.args[0]))
    return 0


def _reset_fabric(state: dict[str, Any]) -> None:
    for gpu in state["gpus"]:
        gpu["fabric"] = gpusim.idle_fabric(state.get("nvswitch", True))


def cmd_reload(_args: argparse.Namespace) -> int:
    installed = gpusim.installed_driver()
    if installed is None:
        return _die("modprobe: FATAL: Module nvidia not found (no NVIDIA driver installed)")
    with gpusim.locked():
        state = gpusim.load()
        clients = gpusim.gpu_clients(state)
        if clients:
            return _die(f"rmmod: ERROR: Module nvidia is in use by: {', '.join(clients)}")
        state["loaded_driver"] = installed
        _reset_fabric(state)
        gpusim.save(state)
    print(f"gpu-sim: nvidia module reloaded, driver {installed}")
    return 0


def _valid_module(name: str) -> str | None:
    module = gpusim.module_name(name)
    if not module or any(c.isspace() or c == "/" for c in module):
        return None
    return module


def cmd_modprobe(args: argparse.Namespace) -> int:
    module = _valid_module(args.name)
    if module is None:
        return _die(f"modprobe: invalid module name {args.name!r}", 2)
    with gpusim.locked():
        modules = gpusim.loaded_modules()
        if module not in modules:
            gpusim.write_modules([*modules, module])
    print(f"gpu-sim: module {module} loaded")
    return 0


def cmd_rmmod(args: argparse.Namespace) -> int:
    module = _valid_module(args.name)
    if module is None:
        return _die(f"rmmod: invalid module name {args.name!r}", 2)
    with gpusim.locked():
        modules = gpusim.loaded_modules()
        if module in modules:
            gpusim.write_modules([m for m in modules if m != module])
            print(f"gpu-sim: module {module} unloaded")
        else:
            print(f"gpu-sim: module {module} is not loaded")
    return 0


def load_boot_modules() -> list[str]:
    """A boot starts with no module loaded but those modules-load.d names (what was only modprobed is gone)."""
    with gpusim.locked():
        names = gpusim.modules_to_load()
        gpusim.write_modules(names)
    return names


def cmd_boot(_args: argparse.Namespace) -> int:
    load_boot_modules()
    if not gpusim.exists():
        print(f"gpu-sim: no description at {gpusim.state_path()}; nothing to boot")
        return 0

    mark = gpusim.power_on_mark()
    cold = mark.exists()

    def boot(state: dict[str, Any]) -> None:
        if cold:  # the power was off: the PCIe links train anew, only dead GPUs stay away
            for gpu in state["gpus"]:
                if not gpu.get("dead"):
                    gpu["present"] = True
        state["loaded_driver"] = gpusim.installed_driver()
        state["fm_running"] = False
        _reset_fabric(state)
        for gpu in state["gpus"]:
            gpu["persistence_mode"] = False
            gpu["xid_events"] = []  # the kernel log (journalctl -k) starts anew with each boot
        for port in state.get("ib_ports", []):
            port.pop("counters", None)  # the HCA's counters start from 0 with its driver
        state.pop("edac", None)  # and the memory controllers' with the kernel

    state = gpusim.update(boot)
    for name in ("fabricmanager", "hostengine", "nvidia-persistenced"):
        if gpusim.pid_alive(name) is False:
            with contextlib.suppress(OSError):
                gpusim.pid_file(name).unlink()
    gpusim.make_devices(len(state["gpus"]))
    mark.unlink(missing_ok=True)
    kind = "cold start" if cold else "reboot"
    print(f"gpu-sim: booted ({kind}), driver {state['loaded_driver'] or 'not loaded'}")
    return 0


def cmd_driver_installed(_args: argparse.Namespace) -> int:
    """A fresh driver install behaves like the first boot with it; an upgrade waits for reload/reboot."""
    installed = gpusim.installed_driver()
    if not gpusim.exists() or installed is None:
        return 0

    def load_first(state: dict[str, Any]) -> None:
        if not state.get("loaded_driver"):
            state["loaded_driver"] = installed
            _reset_fabric(state)

    gpusim.update(load_first)
    return 0


def kernel_xid_line(gpu: dict[str, Any], event: dict[str, Any]) -> str:
    """One XID event as drivers 535+ log it (tests/samples/dmesg-xid-*.log), e.g.
    NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."""
    domain, bus, device = gpu["pci_bus_id"].split(".")[0].lower().split(":")
    xid = int(event.get("xid", 0))
    message = str(event.get("message") or gpusim.XID_MESSAGES.get(xid, "Unknown XID")).rstrip(".")
    return f"NVRM: Xid (PCI:{domain[-4:]}:{bus}:{device}): {xid}, pid='<unknown>', name=<unknown>, {message}."


def cmd_kernel_log(args: argparse.Namespace) -> int:
    state = gpusim.load()
    now = time.time()
    events = []
    for gpu in state["gpus"]:  # a GPU that fell off the bus logged its XIDs before it went
        for event in gpu.get("xid_events", []):
            when = float(event.get("time", 0))
            if args.since is None or now - when <= args.since:
                events.append((when, gpu["index"], kernel_xid_line(gpu, event)))
    for entry in state.get("journal", []):  # what the persistent journal kept, also from the boots before this one
        when = float(entry.get("time", 0))
        if args.since is None or now - when <= args.since:
            events.append((when, -1, str(entry["line"])))
    for _when, _index, line in sorted(events):
        print(line)
    return 0


def cmd_nvme_smart_log(args: argparse.Namespace) -> int:
    state = gpusim.load()
    name = args.device.removeprefix("/dev/")
    if name not in gpusim.nvme_drives(state):
        return _die(f"{args.device}: No such file or directory")
    print(gpusim.nvme_smart_log_text(state, name))
    return 0


def process_name(pid: int) -> str:
    """The executable as nvidia-smi names a compute process (its full path)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode() or "[unknown]"
        except OSError:
            return "[unknown]"


def cmd_attach(args: argparse.Namespace) -> int:
    if not args.stuck and not gpusim.process_alive(args.pid):
        return _die(f"no process {args.pid}")
    entry = {"pid": args.pid, "name": process_name(args.pid), "used_memory_mib": args.memory, "stuck": args.stuck}

    def attach(state: dict[str, Any]) -> None:
        gpu = _gpu(state, args.gpu)
        gpu["processes"] = [p for p in gpu.get("processes", []) if p["pid"] != args.pid] + [entry]

    try:
        gpusim.update(attach)
    except KeyError as exc:
        return _die(str(exc.args[0]))
    return 0


def cmd_detach(args: argparse.Namespace) -> int:
    def detach(state: dict[str, Any]) -> None:
        for gpu in state["gpus"]:
            gpu["processes"] = [p for p in gpu.get("processes", []) if args.pid is not None and p["pid"] != args.pid]

    gpusim.update(detach)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-sim", description="Control the simulated NVIDIA GPUs of a test node.")
    sub = parser.add_subparsers(dest="command", required=True)

    init = sub.add_parser("init", help="create the GPU description")
    init.add_argument("--gpus", type=int, default=8)
    init.add_argument("--model", default=gpusim.DEFAULT_MODEL)
    init.add_argument("--no-nvswitch", action="store_true")
    init.add_argument("--hostname")
    init.add_argument("--force", action="store_true")
    init.set_defaults(func=cmd_init)

    sub.add_parser("show", help="print the description").set_defaults(func=cmd_show)

    setp = sub.add_parser("set", help="set one value by dotted path")
    setp.add_argument("path")
    setp.add_argument("value")
    setp.set_defaults(func=cmd_set)

    for name, func, choices in (("fault", cmd_fault, FAULTS), ("clear", cmd_clear, (*FAULTS, "all"))):
        p = sub.add_parser(name, help=f"{name} a named fault")
        if name == "fault":
            p.add_argument("name", choices=choices)
        else:
            p.add_argument("name", choices=choices, nargs="?", default="all")
        p.add_argument("--gpu", type=int)
        p.add_argument("--xid", type=int, default=79)
        p.add_argument("--link", type=int, default=3)
        p.add_argument("--device", help="mlx5_N (default mlx5_0) or nvmeN (default: nvme9 missing, nvme3 warning)")
        p.set_defaults(func=func)

    sub.add_parser("reload", help="simulate an nvidia module reload").set_defaults(func=cmd_reload)
    sub.add_parser("boot", help="simulate a boot").set_defaults(func=cmd_boot)
    sub.add_parser("driver-installed", help="driver package hook").set_defaults(func=cmd_driver_installed)
    klog = sub.add_parser("kernel-log", help="XID events in the kernel's format (like journalctl -k -o cat)")
    klog.add_argument("--since", type=float, help="only events of the last SECONDS")
    klog.set_defaults(func=cmd_kernel_log)
    smart = sub.add_parser("nvme-smart-log", help="an NVMe drive's SMART log (as nvme smart-log -o json)")
    smart.add_argument("device", help="/dev/nvmeN")
    smart.set_defaults(func=cmd_nvme_smart_log)
    for name, func, helptext in (
        ("modprobe", cmd_modprobe, "load a kernel module (the stand-in's module list)"),
        ("rmmod", cmd_rmmod, "unload a kernel module (the stand-in's module list)"),
    ):
        mod = sub.add_parser(name, help=helptext)
        mod.add_argument("name", metavar="NAME")
        mod.set_defaults(func=func)
    attach = sub.add_parser("attach", help="a process holds a GPU (a compute app for nvidia-smi)")
    attach.add_argument("--gpu", type=int, required=True)
    attach.add_argument("--pid", type=int, required=True)
    attach.add_argument("--memory", type=int, default=1024, help="MiB the process holds")
    attach.add_argument("--stuck", action="store_true", help="listed even after the process is gone")
    attach.set_defaults(func=cmd_attach)
    detach = sub.add_parser("detach", help="forget GPU contexts (of --pid, or all)")
    detach.add_argument("--pid", type=int)
    detach.set_defaults(func=cmd_detach)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except gpusim.StateMissingError as exc:
        return _die(str(exc))


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())

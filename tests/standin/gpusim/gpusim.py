"""Shared state of the simulated GPUs (stand-in for NVIDIA hardware in tests).

Installed on nodes as /usr/lib/gpu-sim/gpusim.py; every stand-in tool (nvidia-smi, nv-fabricmanager,
nv-hostengine, dcgmi, gpu-sim ...) imports it. Stdlib only, Python 3.11.

Paths (each overridable by an environment variable, which the host-side tests use):
  GPU_SIM_STATE  description file            default /etc/gpu-sim/gpus.json
  GPU_SIM_LIB    installed version files     default /usr/lib/gpu-sim  (driver-version, fm-version, dcgm-version)
  GPU_SIM_RUN    pid files                   default /run/gpu-sim
  GPU_SIM_SYSFS  fake sysfs root             default /var/lib/gpu-sim/sysfs
  GPU_SIM_DEV    where device nodes go       default /dev
  GPU_SIM_POWER_ON  the mark a BMC stand-in leaves before a power-on  default /var/lib/gpu-sim/power-on
  GPU_SIM_MODULES   loaded kernel modules (/proc/modules format)        default /var/lib/gpu-sim/modules
  GPU_SIM_MODULES_LOAD_D  modules a boot loads (*.conf, one a line)  default /etc/modules-load.d
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

# Every stand-in tool imports this module, and the health check starts several of them on every run: what only
# some functions need (socket, uuid, tempfile, shutil) is imported there, not here.
if TYPE_CHECKING:
    from typing import Any

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_MEMORY_MIB = 81559
NVLINKS_PER_GPU = 18
NVLINK_SPEED_GBPS = 26.562
IB_DEVICES = 8
IB_RATE_GBPS = 400
# NCCL all_reduce bus bandwidth the stand-in all_reduce_perf approaches with large messages: 470 GB/s at
# 8 GiB, as a healthy 8x H100 on NVSwitch (tests/samples/all_reduce_perf.8xh100.nccl-tests-290.txt: 473.6 at 4 GiB)
NCCL_BUSBW_GBPS = 485
HOSTENGINE_PORT = 5555
# PCI bus numbers of the eight SXM GPUs of a DGX H100, in nvidia-smi index order.
PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
NVIDIA_MAJOR = 195
_UUID_NAMESPACE = "5d1f4c1e-8f0b-4c8e-9a53-6e1b0c5a7d21"

# Clock event (throttle) reason bits, as NVML defines them.
THROTTLE_BITS = {
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
}

XID_MESSAGES = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "Double Bit ECC Error",
    63: "Row remapping event",
    64: "Row remapping failure",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    # as an H100's driver logs them (tests/samples/dmesg-xid-119.h100-xe9680.log; NVIDIA's Xid catalog for 154)
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
MEMORY_XIDS = frozenset({48, 63, 64, 92, 94, 95})
NVLINK_XIDS = frozenset({74})
RECENT_XID_SECONDS = 24 * 3600
HOT_TEMPERATURE_C = 90

NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
EXIT_NO_DRIVER = 9
EXIT_MISMATCH = 18


class StateMissingError(RuntimeError):
    """No description file: the node has no (simulated) GPUs yet."""


# --------------------------------------------------------------------------- paths


def state_path() -> Path:
    return Path(os.environ.get("GPU_SIM_STATE") or "/etc/gpu-sim/gpus.json")


def lib_dir() -> Path:
    return Path(os.environ.get("GPU_SIM_LIB") or "/usr/lib/gpu-sim")


def run_dir() -> Path:
    return Path(os.environ.get("GPU_SIM_RUN") or "/run/gpu-sim")


def sysfs_root() -> Path:
    return Path(os.environ.get("GPU_SIM_SYSFS") or "/var/lib/gpu-sim/sysfs")


def dev_dir() -> Path:
    return Path(os.environ.get("GPU_SIM_DEV") or "/dev")


def power_on_mark() -> Path:
    """Left by the stand-in BMC (tests/standin/bmc.py) before it powers the node on: the next boot is
    a cold start."""
    return Path(os.environ.get("GPU_SIM_POWER_ON") or "/var/lib/gpu-sim/power-on")


def modules_path() -> Path:
    """The stand-in's loaded kernel modules, in /proc/modules format (gpu-sim modprobe/rmmod/boot)."""
    return Path(os.environ.get("GPU_SIM_MODULES") or "/var/lib/gpu-sim/modules")


def modules_load_dir() -> Path:
    """Where a boot finds the modules to load (systemd-modules-load's *.conf files)."""
    return Path(os.environ.get("GPU_SIM_MODULES_LOAD_D") or "/etc/modules-load.d")


def journal_socket() -> Path:
    """journald's native socket on the node: where the stand-in's kernel lines go (log_kernel)."""
    return Path(os.environ.get("GPU_SIM_JOURNAL") or "/run/systemd/journal/socket")


def log_kernel(line: str) -> None:
    """Log ``line`` as the kernel logs it: into the node's journal with identifier kernel, facility kern and
    priority warning, from where the node's syslog forwarding takes it as it takes a real node's kernel lines
    (a container has no kernel ring buffer of its own). Without a journal (a test on a bare machine): nothing."""
    import socket

    fields = {"MESSAGE": line, "SYSLOG_IDENTIFIER": "kernel", "SYSLOG_FACILITY": "0", "PRIORITY": "4"}
    target = journal_socket()
    if not target.is_socket():
        return
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.sendto("".join(f"{key}={value}\n" for key, value in fields.items()).encode(), str(target))


# --------------------------------------------------------------------------- kernel modules


def module_name(name: str) -> str:
    """The kernel's spelling of a module name: '-' and '_' are the same, /proc/modules lists '_'."""
    return name.strip().replace("-", "_")


def loaded_modules() -> list[str]:
    """Names in the stand-in's module list (empty when there is none yet)."""
    try:
        text = modules_path().read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [line.split()[0] for line in text.splitlines() if line.split()]


def write_modules(names: list[str]) -> None:
    """Write the module list atomically, one /proc/modules line per module."""
    path = modules_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(f"{name} 16384 0 - Live 0x0000000000000000\n" for name in names))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (mode 0644) through a temporary file: a reader sees the old or the new."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def modules_to_load() -> list[str]:
    """What systemd-modules-load loads at boot: the names in modules-load.d/*.conf in file-name order, one a line;
    empty lines and lines starting with '#' or ';' are comments. An unreadable file is skipped."""
    names: list[str] = []
    for conf in sorted(modules_load_dir().glob("*.conf"), key=lambda p: p.name):
        try:
            text = conf.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for raw in text.splitlines():
            line = raw.strip()
            if line and not line.startswith(("#", ";")):
                name = module_name(line)
                if name not in names:
                    names.append(name)
    return names


# --------------------------------------------------------------------------- versions


def read_version(name: str) -> str | None:
    """Content of a version file in the lib dir (written by the stand-in packages), or None."""
    try:
        text = (lib_dir() / name).read_text().strip()
    except OSError:
        return None
    return text or None


def installed_driver() -> str | None:
    return read_version("driver-version")


def installed_fm() -> str | None:
    return read_version("fm-version")


def installed_dcgm() -> str | None:
    return read_version("dcgm-version")


def cuda_version(driver: str | None) -> str:
    branch = int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else 0
    if branch >= 580:
        return "13.0"
    if branch >= 570:
        return "12.8"
    if branch >= 560:
        return "12.6"
    if branch >= 550:
        return "12.4"
    return "12.2"


# --------------------------------------------------------------------------- description


def gpu_uuid(hostname: str, index: int) -> str:
    import uuid

    return f"GPU-{uuid.uuid5(uuid.UUID(_UUID_NAMESPACE), f'{hostname}/{index}')}"


def pci_bus_id(index: int) -> str:
    bus = PCI_BUSES[index] if index < len(PCI_BUSES) else f"{0xDC + index:02X}"
    return f"00000000:{bus}:00.0"


def base_temperature(index: int) -> int:
    return 31 + (index * 3) % 7


def base_power(index: int) -> float:
    return round(69.5 + (index * 1.7) % 6, 1)


def default_nvlink() -> dict[str, Any]:
    return {"state": "up", "speed_gbps": NVLINK_SPEED_GBPS, "crc_errors": 0, "replay_errors": 0, "recovery_errors": 0}


def default_ecc() -> dict[str, Any]:
    return {
        "volatile_uncorrected": 0,
        "aggregate_uncorrected": 0,
        "volatile_corrected": 0,
        "remapped_rows_pending": 0,
        "remapped_rows_failure": 0,
        "retired_pages_pending": False,
    }


def default_pcie() -> dict[str, int]:
    """An H100 SXM's link: Gen5 x16 (tests/samples/nvidia-smi-q.h100-sxm.545.23.08.txt)."""
    return {"gen_max": 5, "gen": 5, "width_max": 16, "width": 16, "replays": 0}


def memory_temperature(gpu: dict[str, Any]) -> int:
    """HBM runs some degrees above the GPU core at rest (the sample: 41 C at 33 C)."""
    return int(gpu.get("memory_temperature_c", gpu["temperature_c"] + 8))


def idle_fabric(nvswitch: bool) -> dict[str, str]:
    return {"state": "Not Started", "status": "N/A"} if nvswitch else {"state": "N/A", "status": "N/A"}


def new_gpu(hostname: str, index: int, nvswitch: bool) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": gpu_uuid(hostname, index),
        "pci_bus_id": pci_bus_id(index),
        "present": True,
        "temperature_c": base_temperature(index),
        "power_w": base_power(index),
        "sm_clock_mhz": 1980,
        "persistence_mode": False,
        "throttle_reasons": [],
        "pcie": default_pcie(),
        "ecc": default_ecc(),
        "xid_events": [],
        "nvlinks": [default_nvlink() for _ in range(NVLINKS_PER_GPU)] if nvswitch else [],
        "fabric": idle_fabric(nvswitch),
    }


def new_ib_port(index: int) -> dict[str, Any]:
    return {"device": f"mlx5_{index}", "port": 1, "state": "ACTIVE", "rate_gbps": IB_RATE_GBPS}


def new_state(
    hostname: str | None = None, gpus: int = 8, model: str = DEFAULT_MODEL, nvswitch: bool = True
) -> dict[str, Any]:
    import socket

    host = hostname or socket.gethostname()
    return {
        "hostname": host,
        "model": model,
        "nvswitch": nvswitch,
        "memory_total_mib": DEFAULT_MEMORY_MIB,
        "gpus": [new_gpu(host, i, nvswitch) for i in range(gpus)],
        "ib_ports": [new_ib_port(i) for i in range(IB_DEVICES)],
        "loaded_driver": installed_driver(),
        "fm_running": False,
        "hostengine": {"port": HOSTENGINE_PORT},
    }


def exists() -> bool:
    return state_path().is_file()


def load() -> dict[str, Any]:
    path = state_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StateMissingError(f"no GPU description at {path} (run 'gpu-sim init')") from None


def load_or_none() -> dict[str, Any] | None:
    try:
        return load()
    except (StateMissingError, ValueError):
        return None


def save(state: dict[str, Any]) -> None:
    """Write the description atomically (temp file + rename), then refresh the fake sysfs tree."""
    import tempfile

    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(state, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    write_sysfs(state)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise read-modify-write cycles of several processes (daemons start concurrently)."""
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def update(change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
    """Load, apply change (mutate in place or return a new dict), save; under a lock. Returns the new state."""
    with locked():
        state = load()
        result = change(state)
        if result is not None:
            state = result
        save(state)
        return state


def present_gpus(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [gpu for gpu in state.get("gpus", []) if gpu.get("present", True)]


def process_alive(pid: int) -> bool:
    """Whether pid is a running process (not a zombie) in this node's process table."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1]
    except (OSError, IndexError):
        return False
    return fields[:1] not in ("Z", "X")


def compute_apps(state: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(GPU, process) for each process the driver counts as holding a present GPU: attached with
    `gpu-sim attach` and still running, or marked stuck (a context the driver keeps after its
    process is gone or unkillable, which is how a GPU stays held on real nodes)."""
    apps = []
    for gpu in present_gpus(state):
        for proc in gpu.get("processes", []):
            if proc.get("stuck") or process_alive(int(proc["pid"])):
                apps.append((gpu, proc))
    return apps


def hostengine_request(host: str, port: int, payload: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One request of nv-hostengine's JSON line protocol (the client side used by dcgmi and dcgm-exporter)."""
    import socket

    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def throttle_mask(reasons: list[str]) -> int:
    mask = 0
    for reason in reasons:
        mask |= THROTTLE_BITS.get(reason, 0)
    return mask


def driver_check(state: dict[str, Any] | None) -> tuple[int, str]:
    """What nvidia-smi/NVML would say about the driver: (0, "") when usable, else (exit code, message)."""
    installed = installed_driver()
    if state is None or installed is None or not state.get("loaded_driver"):
        return EXIT_NO_DRIVER, NO_DRIVER_MESSAGE
    if state["loaded_driver"] != installed:
        return (
            EXIT_MISMATCH,
            f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {installed}",
        )
    return 0, ""


# --------------------------------------------------------------------------- health (shared by dcgmi)


def gpu_incidents(gpu: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """Problems DCGM would report for one GPU: dicts with gpu, system, message."""
    now = time.time() if now is None else now
    index = gpu["index"]
    found: list[dict[str, Any]] = []

    def add(system: str, message: str) -> None:
        found.append({"gpu": index, "system": system, "message": message})

    ecc = gpu.get("ecc", {})
    if ecc.get("volatile_uncorrected", 0) > 0:
        add("memory", f"{ecc['volatile_uncorrected']} volatile uncorrectable ECC error(s) on GPU {index}")
    if ecc.get("remapped_rows_pending"):
        add("memory", f"GPU {index} has a pending row remap; reset the GPU")
    if ecc.get("remapped_rows_failure"):
        add("memory", f"GPU {index} had a row remapping failure")
    for event in gpu.get("xid_events", []):
        when = float(event.get("time", 0))
        if now - when < RECENT_XID_SECONDS:
            xid = int(event.get("xid", 0))
            system = "memory" if xid in MEMORY_XIDS else "nvlink" if xid in NVLINK_XIDS else "pcie"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
            add(system, f"XID {xid} at {stamp}: {event.get('message', XID_MESSAGES.get(xid, 'unknown'))}")
    for number, link in enumerate(gpu.get("nvlinks", [])):
        if link.get("state") != "up":
            add("nvlink", f"NVLink {number} of GPU {index} is inactive")
    if gpu.get("temperature_c", 0) > HOT_TEMPERATURE_C:
        add("thermal", f"GPU {index} temperature {gpu['temperature_c']} C is above {HOT_TEMPERATURE_C} C")
    return found


# What DCGM's health watches report for a GPU (gpu-sim faults dcgm-pcie-replay, dcgm-dbe): its system, severity and
# message as DCGM words them (dcgm_errors.h: the message, then the next step).
DCGM_HEALTH = {
    "dcgm-pcie-replay": (
        "PCIe system", "Warning",
        "Detected more than 8 PCIe replays per minute for GPU {gpu} : 13 Reconnect PCIe card. Run system side PCIE"
        " diagnostic utilities to verify hops off the GPU board. If issue is on the board, run the field diagnostic.",
    ),
    "dcgm-dbe": (
        "Memory system", "Failure",
        "Detected 1 volatile double-bit ECC error(s) in GPU {gpu}. Drain the GPU and reset it or reboot the node.",
    ),
}  # fmt: skip


def dcgm_health_incidents(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    """The health watches' incidents of one GPU: dicts with gpu, system, severity, message."""
    found = []
    for fault in gpu.get("dcgm_health", []):
        system, severity, message = DCGM_HEALTH[fault]
        found.append({"gpu": gpu["index"], "system": system, "severity": severity,
                      "message": message.format(gpu=gpu["index"])})  # fmt: skip
    return found


# --------------------------------------------------------------------------- processes


def pid_file(name: str) -> Path:
    return run_dir() / f"{name}.pid"


def write_pid(name: str) -> Path:
    path = pid_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
    return path


def remove_pid(name: str) -> None:
    path = pid_file(name)
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip()) == os.getpid():
            path.unlink()


def pid_alive(name: str) -> bool | None:
    """True/False for the pid in run_dir()/name.pid; None when there is no pid file."""
    try:
        pid = int(pid_file(name).read_text().strip())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not a client any more
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def gpu_clients(state: dict[str, Any]) -> list[str]:
    """Processes that keep the (simulated) nvidia module busy."""
    clients = []
    fm_alive = pid_alive("fabricmanager")
    if state.get("fm_running") and fm_alive is not False:
        clients.append("nv-fabricmanager")
    if pid_alive("hostengine"):
        clients.append("nv-hostengine")
    return clients


_TERMINATED: list[int] = []  # the read end of the pipe a stop signal is written to (catch_termination)


def catch_termination() -> None:
    """Catch SIGTERM/SIGINT from now on: a daemon calls this before it changes any state, so a
    signal during start-up still ends in its clean shutdown (as the real daemons do). The signal's
    number reaches run_until_terminated through Python's wakeup fd, a pipe: no lock is taken in a
    signal handler (an Event set there could deadlock against the main thread's own wait on it)."""
    if _TERMINATED:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    _TERMINATED.append(read_end)


def run_until_terminated(on_exit: Callable[[], None]) -> int:
    """Block until SIGTERM/SIGINT (also one that came since catch_termination), run on_exit, return 0 (the daemons'
    foreground loop)."""
    catch_termination()
    try:
        os.read(_TERMINATED[0], 1)
    finally:
        on_exit()
    return 0


def notify_ready() -> None:
    """sd_notify READY=1 when started by systemd with Type=notify (a no-op otherwise)."""
    import socket

    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(b"READY=1")


# --------------------------------------------------------------------------- sysfs and devices


EDAC_CONTROLLERS = 2  # a two-socket host: one memory controller per socket
NVME_DRIVES = 10  # as a DGX H100: 2 M.2 boot drives and 8 U.2 data drives (nvme0-1 boot, nvme2-9 data)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


SMART_LOG_FILE = "gpu-sim-smart-log.json"  # in each drive's fake sysfs directory (tests/standin/gpusim/gpu-sim-nvme)


def nvme_drives(state: dict[str, Any]) -> list[str]:
    """The stand-in NVMe controllers present (a missing one has left the bus)."""
    missing = set(state.get("nvme", {}).get("missing", []))
    return [f"nvme{n}" for n in range(int(state.get("nvme_drives", NVME_DRIVES))) if f"nvme{n}" not in missing]


def nvme_smart_log(state: dict[str, Any], name: str) -> dict[str, Any]:
    """A drive's SMART / Health log as nvme-cli prints it with --output-format=json (the keys of the real
    samples in tests/samples/); critical_warning is what `gpu-sim fault nvme-warning` set."""
    warning = int(state.get("nvme", {}).get("warnings", {}).get(name, 0))
    return {
        "critical_warning": warning,
        "temperature": 308,
        "avail_spare": 100 if not warning & 0x01 else 5,
        "spare_thresh": 10,
        "percent_used": 1 if name in ("nvme0", "nvme1") else 2,
        "endurance_grp_critical_warning_summary": 0,
        "data_units_read": 1203345,
        "data_units_written": 2950112,
        "host_read_commands": 20311455,
        "host_write_commands": 61224309,
        "controller_busy_time": 118,
        "power_cycles": 41,
        "power_on_hours": 7281,
        "unsafe_shutdowns": 12,
        "media_errors": 0 if not warning & 0x04 else 3,
        "num_err_log_entries": 0,
        "warning_temp_time": 0,
        "critical_comp_time": 0,
    }


def nvme_smart_log_text(state: dict[str, Any], name: str) -> str:
    """The SMART log as `nvme smart-log -o json` prints it (without its last newline): what `gpu-sim
    nvme-smart-log` prints and what gpu-sim-nvme reads from the drive's SMART_LOG_FILE."""
    return json.dumps(nvme_smart_log(state, name), indent=2)


# The error counters of an mlx5 port's counters/ directory the checks read (and link_downed)
IB_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


def _ib_rate_text(gbps: int) -> str:
    generation = {400: "NDR", 200: "HDR", 100: "EDR", 56: "FDR", 40: "QDR"}.get(int(gbps), "NDR")
    return f"{int(gbps)} Gb/sec (4X {generation})"


def write_sysfs(state: dict[str, Any]) -> None:
    """Mirror the IB ports into <sysfs>/class/infiniband/<dev>/ports/<port>/{state,phys_state,rate}."""
    import shutil

    root = sysfs_root() / "class" / "infiniband"
    try:
        for port in state.get("ib_ports", []):
            directory = root / port["device"] / "ports" / str(port.get("port", 1))
            directory.mkdir(parents=True, exist_ok=True)
            active = port.get("state") == "ACTIVE"
            files = {
                "state": "4: ACTIVE" if active else "1: DOWN",
                "phys_state": "5: LinkUp" if active else "3: Disabled",
                "rate": _ib_rate_text(port.get("rate_gbps", IB_RATE_GBPS)),
                "link_layer": "InfiniBand",
            }
            counters = {**{name: 0 for name in IB_COUNTERS}, **port.get("counters", {})}
            (directory / "counters").mkdir(exist_ok=True)
            files |= {f"counters/{name}": str(value) for name, value in counters.items()}
            for name, text in files.items():
                target = directory / name
                if not target.exists() or target.read_text() != text + "\n":
                    target.write_text(text + "\n")
        # NVMe controllers: <sysfs>/class/nvme/nvme<N>/{state,transport,model,serial}; a missing one is gone
        nvme, present = sysfs_root() / "class" / "nvme", nvme_drives(state)
        for gone in nvme.glob("nvme*") if nvme.is_dir() else []:
            if gone.name not in present:
                shutil.rmtree(gone)
        for name in present:
            (nvme / name).mkdir(parents=True, exist_ok=True)
            boot = name in ("nvme0", "nvme1")
            files = {
                "state": "live",
                "transport": "pcie",
                "model": "gpu-sim NVMe " + ("boot drive" if boot else "data drive"),
                "serial": f"GPUSIM{int(name[4:]):04d}",
            }
            # and its SMART log as nvme-cli prints it, read by gpu-sim-nvme (a shell stand-in: the health
            # check reads every drive each run, and a Python stand-in per drive was most of a run's CPU)
            files[SMART_LOG_FILE] = nvme_smart_log_text(state, name)
            for file, text in files.items():
                if _read_text(nvme / name / file) != text + "\n":
                    write_text_atomic(nvme / name / file, text + "\n")  # a reader never sees half a log
        # host memory controllers (EDAC): <sysfs>/devices/system/edac/mc/mc<N>/{ue_count,ce_count}
        edac = sysfs_root() / "devices" / "system" / "edac" / "mc"
        for name, counts in {**{f"mc{n}": {} for n in range(EDAC_CONTROLLERS)}, **state.get("edac", {})}.items():
            (edac / name).mkdir(parents=True, exist_ok=True)
            for counter in ("ue_count", "ce_count"):
                target, text = edac / name / counter, f"{int(counts.get(counter, 0))}\n"
                if not target.exists() or target.read_text() != text:
                    target.write_text(text)
    except OSError:
        pass  # best effort: an unprivileged caller cannot write the tree


def make_devices(count: int) -> list[str]:
    """Create /dev/nvidia0..N-1, /dev/nvidiactl, /dev/nvidia-uvm (major 195) when missing and permitted."""
    made = []
    nodes = [(f"nvidia{i}", i) for i in range(count)] + [("nvidiactl", 255), ("nvidia-uvm", 250)]
    for name, minor in nodes:
        path = dev_dir() / name
        if path.exists():
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
            os.chmod(path, 0o666)
            made.append(str(path))
        except OSError:
            continue
    return made

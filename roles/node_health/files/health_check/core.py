"""What every check shares: the settings file and its validation, running a command with a timeout,
the node (its tools' output, read once), and the ways a check ends."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = "/etc/corectl/health.json"
# what Slurm sends to a job's processes when it is cancelled or preempted (SIGTERM, then SIGKILL), and Ctrl-C
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT})
STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

# name -> (type(s), default). Keys are the role variables without their node_health_ prefix.
SETTINGS: dict[str, tuple[Any, Any]] = {
    "gpu_count": (int, 0),
    "gpu_model": (str, ""),
    "driver_version": (str, ""),
    "nvswitch": (bool, False),
    "persistence": (bool, True),
    "max_temperature": (int, 85),
    "max_memory_temperature": (int, 95),
    "pcie_replay_max": (int, 100),
    "throttle_reasons": (list, ["HwSlowdown", "HwThermalSlowdown", "SwThermalSlowdown"]),
    "ecc_volatile_uncorrected_max": (int, 0),
    "xid_window_s": (int, 3600),
    "xid_catalog": (dict, {}),
    "xid_classes": (dict, {}),
    "xid_command": ((list, str), ["journalctl", "-k", "-q", "--no-pager", "-o", "cat", "--since=-{window}s"]),
    "nvlink_links": (int, 0),
    "nvlink_error_max": (int, 100),
    "ib_sysfs_root": (str, "/sys/class/infiniband"),
    "ib_rate_gbps": (int, 0),
    "ib_ports": (int, 0),
    "ib_error_counters": (
        list,
        [
            "symbol_error",
            "link_error_recovery",
            "port_rcv_errors",
            "local_link_integrity_errors",
            "excessive_buffer_overrun_errors",
        ],
    ),
    "ib_error_increase_max": (int, 10),
    "ib_link_downed_max": (int, 0),
    "ib_xmit_discards_increase_max": (int, 100),
    "gpudirect_module": (str, ""),
    "modules_file": (str, "/proc/modules"),
    "mounts": (list, []),
    "edac_sysfs_root": (str, "/sys/devices/system/edac/mc"),
    "edac_ue_max": (int, 0),
    "nvme_count": (int, 0),
    "nvme_sysfs_root": (str, "/sys/class/nvme"),
    "nvme_smart_command": (list, ["nvme", "smart-log", "{device}", "--output-format=json"]),
    "services": (list, ["munge", "slurmd"]),
    "fabricmanager_service": (str, "nvidia-fabricmanager"),
    "clock": (bool, False),
    "clock_unsynced_grace_s": (int, 300),
    "dcgm_health": (bool, True),
    "dcgm_diag_level": (int, 0),
    "command_timeout_s": (int, 30),
    "dcgm_diag_timeout_s": (int, 3600),
    "nccl_command": (list, ["/usr/local/bin/all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"]),
    "nccl_busbw_min_gbps": (int, 0),
    "nccl_pair_command": (
        list,
        [
            "srun",
            "--ntasks-per-node=1",
            "--gres=gpu:{gpus}",
            "--mpi=pmix",
            "/usr/local/bin/all_reduce_perf",
            "-b",
            "1G",
            "-e",
            "8G",
            "-f",
            "2",
            "-g",
            "{gpus}",
        ],
    ),
    "nccl_pair_busbw_min_gbps": (int, 0),
    "nccl_timeout_s": (int, 900),
    "ib_pair_command": (list, ["ib_write_bw", "--report_gbits", "-F", "-s", "1048576", "-n", "20000"]),
    "ib_pair_launcher": (list, ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist={partner}"]),
    "ib_write_bw_min_gbps": (int, 0),
    "ib_pair_timeout_s": (int, 120),
    "state_dir": (str, "/var/lib/corectl/health"),
}

# Clock event ("throttle") reason bits, as NVML defines them (nvmlClocksEventReason*).
THROTTLE_BITS = {
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
    "DisplayClockSetting": 0x100,
}

# "NVRM: Xid (PCI:0000:18:00): 79, ..." and, attributed to a MIG instance, "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94,
# ..." or "(PCI:0000:3b:00 GPU-I:01 GPU-CI:02)" (the driver's kernel_rc.c): the Xid belongs to the GPU on that bus.

# Every per-GPU value the checks read, fetched with one nvidia-smi call.
GPU_FIELDS = [
    "index",
    "name",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "temperature.gpu",
    "clocks_event_reasons.active",
    "ecc.errors.uncorrected.volatile.total",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
]
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


# "GPU 00000000:19:00.0": where a GPU's section of `nvidia-smi -q` begins
Q_GPU = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s*$")


def q_gpus(text: str) -> list[dict[str, str]]:
    """`nvidia-smi -q` as one dict per GPU, each value by its path of section names:
    ``"GPU Link Info/Link Width/Current": "16x"``, ``"Minor Number": "0"``; ``"GPU"`` is the bus id."""
    gpus: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    sections: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if Q_GPU.match(raw):
            current = {"GPU": raw[4:].strip()}
            gpus.append(current)
            sections = []
            continue
        if current is None or not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, colon, value = raw.strip().partition(":")
        while sections and sections[-1][0] >= indent:
            sections.pop()
        if colon and value.strip():
            current["/".join([name for _, name in sections] + [key.strip()])] = value.strip()
        else:
            sections.append((indent, key.strip()))
    return gpus


class ConfigError(Exception):
    """The configuration file is missing, unreadable or wrong (exit 2)."""


class CheckFailed(Exception):
    """A check found a problem; the message is what Slurm shows as the drain reason."""


class Interrupted(CheckFailed):
    """A command the check ran was killed by a signal it did not send (the job around it was cancelled or
    preempted): the check says nothing about the node."""


class Skip(Exception):
    """The check does not apply to this node (the message says why)."""


# --------------------------------------------------------------------------- configuration


def load_config(path: str) -> dict[str, Any]:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    config: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in SETTINGS:
            raise ConfigError(f"{path}: unknown setting {key!r}")
        kind = SETTINGS[key][0]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{path}: {key} must be {names}, not {json.dumps(value)}")
        config[key] = value
    for key, (_kind, default) in SETTINGS.items():
        config.setdefault(key, default)
    for key, entries in (("xid_catalog", config["xid_catalog"]), ("xid_classes", config["xid_classes"])):
        if not all(str(xid).isdigit() for xid in entries):
            raise ConfigError(f"{path}: {key}: keys must be Xid numbers, not {sorted(entries, key=str)}")
    for xid, actions in config["xid_catalog"].items():
        if not (isinstance(actions, list) and len(actions) == 2 and all(isinstance(a, str) for a in actions)):
            raise ConfigError(f"{path}: xid_catalog.{xid} must be [immediate action, investigatory action]")
    for xid, kind in config["xid_classes"].items():
        if kind not in ("ignore", "application", "hardware"):
            raise ConfigError(
                f"{path}: xid_classes.{xid}: unknown class {json.dumps(kind)} (known: ignore, application, hardware)"
            )
    for key in ("throttle_reasons", "mounts", "services", "ib_error_counters"):
        if not all(isinstance(item, str) for item in config[key]):
            raise ConfigError(f"{path}: {key} must be a list of strings")
    unknown = [r for r in config["throttle_reasons"] if r not in THROTTLE_BITS]
    if unknown:
        raise ConfigError(f"{path}: unknown throttle reasons {unknown} (known: {', '.join(THROTTLE_BITS)})")
    if config["dcgm_diag_level"] not in (0, 1, 2, 3):
        raise ConfigError(f"{path}: dcgm_diag_level must be 0 (off), 1, 2 or 3")
    return config


# --------------------------------------------------------------------------- running commands


class Result:
    def __init__(self, rc: int, stdout: str, stderr: str) -> None:
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr

    def first_line(self) -> str:
        for text in (self.stdout, self.stderr):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return ""


def run(argv: list[str], timeout: float) -> Result:
    """Run a command with a timeout; a missing command or a timeout raises CheckFailed.

    On a timeout the child is killed and not waited for: a process stuck in the kernel (a hung
    driver or mount) cannot hold up the health check.
    """
    if shutil.which(argv[0]) is None:
        raise CheckFailed(f"{argv[0]} not found")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        raise CheckFailed(f"{argv[0]}: {exc.strerror or exc}") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise CheckFailed(f"{shlex.join(argv)} did not finish within {timeout:g} s") from None
    if -proc.returncode in STOP_SIGNALS:
        raise Interrupted(f"{argv[0]} was stopped by signal {-proc.returncode}")
    return Result(proc.returncode, stdout, stderr)


class Node:
    """What the checks read from the node, each command run at most once."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.timeout = float(config["command_timeout_s"])
        self._cache: dict[tuple[str, ...], Result] = {}
        self._rows: list[dict[str, str]] | None = None

    def run(self, *argv: str, timeout: float | None = None) -> Result:
        key = tuple(argv)
        if key not in self._cache:
            self._cache[key] = run(list(argv), timeout or self.timeout)
        return self._cache[key]

    def smi(self, *args: str) -> str:
        """nvidia-smi's output; its own message when it fails (no driver, version mismatch)."""
        result = self.run("nvidia-smi", *args)
        if result.rc != 0:
            message = " ".join(line.strip() for line in result.stdout.splitlines() + result.stderr.splitlines())
            raise CheckFailed(f"nvidia-smi failed (rc {result.rc}): {message.strip() or 'no output'}")
        return result.stdout

    def _query(self, fields: list[str]) -> list[dict[str, str]]:
        out = self.smi(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
        rows = []
        for line in out.splitlines():
            if not line.strip():
                continue
            values = [value.strip() for value in line.split(", ")]
            if len(values) != len(fields):
                raise CheckFailed(f"nvidia-smi: unexpected line {line!r} for {','.join(fields)}")
            rows.append(dict(zip(fields, values, strict=True)))
        return rows

    def query(self, fields: list[str]) -> list[dict[str, str]]:
        """nvidia-smi --query-gpu rows (csv,noheader,nounits) as dicts by field name.

        One nvidia-smi call serves every check (each call costs up to a second on a busy node);
        a driver that rejects one of the fields gets one call per check instead.
        """
        if self._rows is None:
            argv = ("nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits")
            self._rows = [] if self.run(*argv).rc == 2 else self._query(GPU_FIELDS)
        if self._rows and all(name in GPU_FIELDS for name in fields):
            return [{name: row[name] for name in fields} for row in self._rows]
        return self._query(fields)

    def q(self) -> list[dict[str, str]]:
        """`nvidia-smi -q`, one dict per GPU (q_gpus), read once."""
        return q_gpus(self.smi("-q"))

    def service_state(self, unit: str) -> str:
        result = self.run("systemctl", "is-active", unit)
        state = result.stdout.strip().splitlines()
        if state:
            return state[0].strip()
        detail = result.stderr.strip().splitlines()
        return f"unknown (systemctl rc {result.rc}: {detail[0] if detail else 'no output'})"

    def driver(self) -> str:
        rows = self.query(["driver_version"])
        if not rows:
            raise CheckFailed("nvidia-smi lists no GPUs")
        return rows[0]["driver_version"]


def needs_gpus(config: dict[str, Any]) -> None:
    if config["gpu_count"] <= 0:
        raise Skip("no GPUs expected (gpu_count 0)")


def needs_nvswitch(config: dict[str, Any]) -> None:
    needs_gpus(config)
    if not config["nvswitch"]:
        raise Skip("no NVSwitch (nvswitch false)")


BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")


def bus_key(text: str) -> tuple[int, ...] | str:
    """A PCI bus id as a key that `--query-gpu=pci.bus_id` ("00000000:18:00.0") and `nvidia-smi -q`'s GPU header
    share whatever the width of the domain; the text itself where it is not one."""
    match = BUS_ID.search(text)
    return tuple(int(part, 16) for part in match.groups()) if match else text.strip().lower()


def gpu_label(row: dict[str, str]) -> str:
    return f"GPU {row.get('index', '?')}"


def summarize(problems: list[str], limit: int = 3) -> str:
    text = "; ".join(problems[:limit])
    if len(problems) > limit:
        text += f"; and {len(problems) - limit} more"
    return text


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""

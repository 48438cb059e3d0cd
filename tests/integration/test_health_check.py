"""The node health checker (roles/node_health/files/corectl-health-check) against the stand-in GPU tools.

Host-only and fast: the checker runs from the source tree; nvidia-smi, nv-fabricmanager, dcgmi and gpu-sim are the
stand-ins of tests/standin on PATH (GPU_SIM_* point into tmp_path); systemctl, chronyc, scontrol and hostname are
small fakes answering from files in tmp_path. Each fault of issue 7 must be reported by the right check, first.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest

from conftest import CHECKER, CHECKER_TOOLS, ROOT, SAMPLES, STANDIN, STANDIN_DRIVER, xid_catalog
from corectl.health.report import CHECK_ORDER as REPORT_ORDER

TOOLS = CHECKER_TOOLS
DRIVER = STANDIN_DRIVER
# the checker reports its checks in this order: most specific first, so a lost GPU is named as
# gpu-count and not as the NVLink or fabric errors that follow from it (docs/roles.md); corectl's
# list leads with its own two (reachable, checker), held against the checker's manifest in
# tests/unit/test_health_manifest.py
CHECK_ORDER = [name for name in REPORT_ORDER[2:] if name not in ("nccl", "nccl-pair", "ib-pair")]  # only when named

FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl is-active UNIT...: the state of each unit is the content of $HEALTH_UNITS/<unit> (default inactive)
[ "$1" = is-active ] || { echo "fake systemctl: only is-active" >&2; exit 1; }
shift
rc=0
for unit in "$@"; do
    state=$(cat "$HEALTH_UNITS/$unit" 2>/dev/null || echo inactive)
    echo "$state"
    [ "$state" = active ] || rc=3
done
exit $rc
"""
FAKE_CHRONYC = """#!/bin/sh
cat "$HEALTH_CHRONY"
"""
CHRONY_SYNCED = (
    "A29FC87B,ntp.example.org,3,1767225600.0,0.000012,0.000001,0.000020,-1.2,0.001,0.02,0.01,0.001,64.1,Normal\n"
)
CHRONY_UNSYNCED = "00000000,,0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,Not synchronised\n"
# chrony with no source serving its own clock (`local stratum 10`): the real report of
# tests/samples/chronyc-tracking.local-stratum-10.srlinux-ntp-server.txt as -c prints it (test_samples checks this)
CHRONY_LOCAL = (
    "7F7F0101,,10,1770180461.000000000,-0.000000000,+0.000000000,0.000000000,-286.484,+0.000,0.000,0.000000000,"
    "0.000000000,0.0,Normal\n"
)


def mounted_writable() -> str | None:
    """A mount point of this machine that the test may write to (for the healthy mounts check)."""
    points = {line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if len(line.split()) > 1}
    for candidate in ("/dev/shm", "/tmp"):
        if candidate in points and os.access(candidate, os.W_OK):
            return candidate
    return None


class SimNode:
    """A simulated healthy DGX H100 in tmp_path plus the checker's settings for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lib = root / "lib"
        self.bin = root / "bin"
        self.units = root / "units"
        for directory in (self.lib, self.bin, self.units):
            directory.mkdir()
        self.chrony = root / "chrony.csv"
        self.chrony.write_text(CHRONY_SYNCED)
        self.hostengine_port = 0
        self.env = dict(
            os.environ,
            PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            GPU_SIM_STATE=str(root / "etc" / "gpus.json"),
            GPU_SIM_LIB=str(self.lib),
            GPU_SIM_RUN=str(root / "run"),
            GPU_SIM_SYSFS=str(root / "sysfs"),
            GPU_SIM_DEV=str(root / "dev"),
            GPU_SIM_MODULES=str(root / "modules"),
            GPU_SIM_MODULES_LOAD_D=str(root / "modules-load.d"),
            HEALTH_UNITS=str(self.units),
            HEALTH_CHRONY=str(self.chrony),
            HEALTH_HOSTENGINE_PORT="1",
            PYTHONDONTWRITEBYTECODE="1",
        )
        for name, script in TOOLS.items():
            self._tool(name, f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN / script}" "$@"{self._extra(name)}\n')
        self._tool("systemctl", FAKE_SYSTEMCTL)
        self._tool("chronyc", FAKE_CHRONYC)
        for name, version in (("driver-version", DRIVER), ("fm-version", DRIVER), ("dcgm-version", "4.2.3")):
            (self.lib / name).write_text(version + "\n")
        for unit in ("nvidia-fabricmanager", "munge", "slurmd"):
            self.service(unit, "active")
        self.sim("init", "--hostname", "dgx01")
        self.sim("set", "fm_running", "true")
        self.smi("-pm", "1")
        self.sim("modprobe", "nvidia-peermem")  # GPUDirect RDMA
        state = json.loads(Path(self.env["GPU_SIM_STATE"]).read_text())
        for gpu in state["gpus"]:  # what a running Fabric Manager leaves behind
            gpu["fabric"] = {"state": "Completed", "status": "Success"}
        Path(self.env["GPU_SIM_STATE"]).write_text(json.dumps(state, indent=2))
        mount = mounted_writable()
        self.config = {
            "gpu_count": 8,
            "gpu_model": "h100",
            "driver_version": DRIVER,
            "nvswitch": True,
            "persistence": True,
            "max_temperature": 85,
            "throttle_reasons": ["HwSlowdown", "HwThermalSlowdown", "SwThermalSlowdown"],
            "ecc_volatile_uncorrected_max": 0,
            "xid_window_s": 3600,
            "xid_catalog": xid_catalog(),
            "xid_classes": {},
            "xid_command": ["gpu-sim", "kernel-log", "--since", "{window}"],
            "nvlink_links": 18,
            "nvlink_error_max": 100,
            "ib_sysfs_root": str(root / "sysfs" / "class" / "infiniband"),
            "edac_sysfs_root": str(root / "sysfs" / "devices" / "system" / "edac" / "mc"),
            "nvme_count": 10,
            "nvme_sysfs_root": str(root / "sysfs" / "class" / "nvme"),
            "nvme_smart_command": [str(STANDIN / "gpusim" / "gpu-sim-nvme"), "smart-log", "{device}"],
            "ib_rate_gbps": 400,
            "ib_ports": 8,
            "gpudirect_module": "nvidia_peermem",
            "modules_file": self.env["GPU_SIM_MODULES"],
            "mounts": [mount] if mount else [],
            "services": ["munge", "slurmd"],
            "clock": True,
            "dcgm_health": False,  # no host engine runs here but in the DCGM tests
            "dcgm_diag_level": 0,
            "command_timeout_s": 30,
            "state_dir": str(root / "state"),
        }
        self.procs: list[subprocess.Popen] = []

    def _extra(self, name: str) -> str:
        # dcgmi talks to this test's host engine (a free port instead of the fixed 5555)
        return ' --host "127.0.0.1:$HEALTH_HOSTENGINE_PORT"' if name == "dcgmi" else ""

    def _tool(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)

    def tool(self, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.bin / name), *args], env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        if check:
            assert result.returncode == 0, f"{name} {args}: {result.stdout}{result.stderr}"
        return result

    def sim(self, *args: str) -> None:
        self.tool("gpu-sim", *args)

    def smi(self, *args: str) -> str:
        return self.tool("nvidia-smi", *args).stdout

    def service(self, unit: str, state: str) -> None:
        (self.units / unit).write_text(state + "\n")

    def write_config(self) -> Path:
        path = self.root / "health.json"
        path.write_text(json.dumps(self.config, indent=2))
        return path

    def check(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(CHECKER), "--config", str(self.write_config()), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def report(self, *args: str) -> tuple[int, dict]:
        result = self.check("--json", *args)
        assert result.returncode in (0, 1), result.stderr
        return result.returncode, json.loads(result.stdout)

    def start_hostengine(self) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.hostengine_port = sock.getsockname()[1]
        self.env["HEALTH_HOSTENGINE_PORT"] = str(self.hostengine_port)
        proc = subprocess.Popen(
            [str(self.bin / "nv-hostengine"), "-n", "-p", str(self.hostengine_port)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        deadline = time.monotonic() + 10
        while self.tool("dcgmi", "discovery", "-l", check=False).returncode != 0:
            assert time.monotonic() < deadline, "nv-hostengine did not start"
            time.sleep(0.1)

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    sim = SimNode(tmp_path)
    try:
        yield sim
    finally:
        sim.close()


def failures(report: dict) -> list[str]:
    return [c["name"] for c in report["checks"] if c["status"] == "fail"]


def message(report: dict, name: str) -> str:
    return next(c["message"] for c in report["checks"] if c["name"] == name)


# --------------------------------------------------------------------------- healthy node and output formats


def test_healthy_node_passes_every_check(node: SimNode):
    rc, report = node.report()
    assert rc == 0, report
    assert report["ok"] is True
    assert report["node"] == socket.gethostname().split(".")[0]
    assert [c["name"] for c in report["checks"]] == CHECK_ORDER
    status = {c["name"]: c["status"] for c in report["checks"]}
    expected_skips = {"dcgm-diag", "dcgm-health"} | ({"mounts"} if not node.config["mounts"] else set())
    assert {name for name, s in status.items() if s == "skip"} == expected_skips
    assert set(c["status"] for c in report["checks"]) <= {"pass", "skip"}
    assert message(report, "gpu-count") == "8 x NVIDIA H100 80GB HBM3"
    assert message(report, "driver-version") == f"driver {DRIVER}"
    assert message(report, "ib") == "8 IB ports active at >= 400 Gb/s"
    assert message(report, "gpudirect") == "nvidia_peermem loaded"
    assert message(report, "nvlink") == "8 GPUs x 18 links active"
    assert message(report, "clock").startswith("synchronised to ntp.example.org")
    assert message(report, "nvme") == (
        "10 NVMe drives live, no SMART critical warning; most worn: nvme9 at 2% of its rated endurance"
    )
    # Slurm's view of a healthy node: no output, exit 0
    slurm = node.check("--slurm")
    assert (slurm.returncode, slurm.stdout) == (0, "")
    # people's view: one line per check
    human = node.check()
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert len(lines) == len(CHECK_ORDER)
    assert lines[1].split()[:2] == ["PASS", "gpu-count"]


FAULTS = [
    # (fault id, how to inject it, check that must report it first, words its message must contain)
    ("lost-gpu", ["fault", "lost-gpu", "--gpu", "5"], "gpu-count", "7 of 8 GPUs visible"),
    ("ecc", ["fault", "ecc", "--gpu", "2"], "ecc", "GPU 2: 1 volatile uncorrectable ECC error(s) (max 0)"),
    ("xid", ["fault", "xid", "--gpu", "0", "--xid", "79"], "xid", "XID 79 on PCI:0000:18:00 (GPU 0): GPU has fallen"),
    ("nvlink-down", ["fault", "nvlink-down", "--gpu", "3", "--link", "7"], "nvlink", "GPU 3 link 7 inactive"),
    ("fm-stopped", None, "fabricmanager", "nvidia-fabricmanager is inactive"),
    ("fm-version-mismatch", None, "fm-version", "Fabric Manager 580.105.08 installed, driver 580.95.05 loaded"),
    ("driver-not-reloaded", None, "driver-version", "Driver/library version mismatch"),
    ("wrong-driver", None, "driver-version", "driver 580.95.05 loaded, expected 580.105.08"),
    ("hot", ["fault", "hot", "--gpu", "6"], "temperature", "GPU 6 at 95 C (max 85 C)"),
    ("ib-down", ["fault", "ib-down", "--device", "mlx5_3"], "ib", "7 of 8 IB ports active at 400 Gb/s: mlx5_3/1 DOWN"),
    ("gpudirect-unloaded", ["rmmod", "nvidia_peermem"], "gpudirect", "nvidia_peermem not loaded (GPUDirect RDMA)"),
    ("missing-mount", None, "mounts", "not mounted"),
    ("throttle", ["fault", "throttle", "--gpu", "1"], "throttle", "GPU 1 HwSlowdown"),
    ("pcie-narrow", ["fault", "pcie-narrow", "--gpu", "3"], "pcie", "GPU 3 PCIe x8 of x16 while busy"),
    ("hbm-hot", ["fault", "hbm-hot", "--gpu", "2"], "temperature", "GPU 2 memory at 100 C (max 95 C)"),
    ("persistence-off", None, "persistence", "persistence mode off on GPU 4"),
    ("fabric-incomplete", ["set", "gpus.5.fabric.state", "In Progress"], "fabric", "GPU 5 (00000000:AB:00.0)"),
    ("nvlink-errors", ["set", "gpus.2.nvlinks.4.crc_errors", "5000"], "nvlink", "GPU 2 link 4 CRC Errors 5000"),
    ("slurmd-down", None, "services", "slurmd is failed"),
    ("nvme-missing", ["fault", "nvme-missing", "--device", "nvme9"], "nvme", "9 of 10 NVMe drives present: nvme[0-8]"),
    (
        "nvme-warning",
        ["fault", "nvme-warning", "--device", "nvme3"],
        "nvme",
        "nvme3 SMART critical warning 0x04: reliability degraded (media or internal errors)",
    ),
    ("clock-unsynced", None, "clock", "clock not synchronised for 0 s (chrony leap status Not synchronised)"),
    ("clock-local-reference", None, "clock", "clock not synchronised to a real source: chrony is serving its local"),
    ("gpu-off-the-bus-no-xid", None, "xid", "GPU on PCI:0000:b3:00 has fallen off the bus and is not responding"),
]


@pytest.mark.parametrize(("fault", "inject", "check", "words"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_reported_by_the_right_check(
    node: SimNode, tmp_path: Path, fault: str, inject: list[str] | None, check: str, words: str
):
    if inject:
        node.sim(*inject)
    elif fault == "fm-stopped":
        node.service("nvidia-fabricmanager", "inactive")
    elif fault == "fm-version-mismatch":
        (node.lib / "fm-version").write_text("580.105.08\n")
    elif fault == "driver-not-reloaded":
        (node.lib / "driver-version").write_text("580.105.08\n")  # package upgraded, old module loaded
    elif fault == "wrong-driver":
        node.config["driver_version"] = "580.105.08"
    elif fault == "missing-mount":
        node.config["mounts"] = [*node.config["mounts"], str(tmp_path / "not-mounted")]
    elif fault == "persistence-off":
        node.smi("-pm", "0", "-i", "4")
    elif fault == "slurmd-down":
        node.service("slurmd", "failed")
    elif fault == "clock-unsynced":  # no grace: fails at once
        node.chrony.write_text(CHRONY_UNSYNCED)
        node.config["clock_unsynced_grace_s"] = 0
    elif fault == "clock-local-reference":
        node.chrony.write_text(CHRONY_LOCAL)
    elif fault == "gpu-off-the-bus-no-xid":  # the real probe-time message, read from the kernel log as the only fault
        node.config["xid_command"] = ["cat", str(SAMPLES / "dmesg-fallen-off-bus.nvsentinel-155.log")]
    rc, report = node.report()
    assert rc == 1
    assert report["ok"] is False
    assert failures(report)[0] == check, report
    assert words in message(report, check)


def test_slurm_format_is_the_first_failure(node: SimNode):
    node.sim("fault", "ecc", "--gpu", "2")
    node.sim("fault", "ib-down")
    slurm = node.check("--slurm")
    assert slurm.returncode == 1
    assert slurm.stdout.splitlines() == [
        "ecc: GPU 2: 1 volatile uncorrectable ECC error(s) (max 0), row remap pending (reset the GPU)"
    ]


def test_an_unsynchronised_clock_warns_until_its_grace_has_passed_and_a_sync_ends_it(node: SimNode):
    node.config["clock_unsynced_grace_s"] = 300
    node.chrony.write_text(CHRONY_UNSYNCED)
    rc, report = node.report("--only", "clock")
    assert rc == 0, report
    assert message(report, "clock").startswith("warning: clock not synchronised for 0 s (chrony leap status Not ")
    state = Path(node.config["state_dir"]) / "clock.json"
    since = json.loads(state.read_text())["unsynced_since"]
    assert abs(since - time.time()) < 60
    # still unsynchronised 301 s after it was first seen so: the node fails
    state.write_text(json.dumps({"unsynced_since": since - 301}))
    rc, report = node.report("--only", "clock")
    assert rc == 1
    assert re.match(
        r"clock not synchronised for 30\d s \(chrony leap status Not synchronised\)$", message(report, "clock")
    )
    # synchronised again: passes, and the next loss of sync starts its own grace
    node.chrony.write_text(CHRONY_SYNCED)
    assert node.report("--only", "clock")[0] == 0
    assert json.loads(state.read_text()) == {}
    node.chrony.write_text(CHRONY_UNSYNCED)
    rc, report = node.report("--only", "clock")
    assert rc == 0 and message(report, "clock").startswith("warning: clock not synchronised for 0 s"), report


def test_clearing_the_fault_passes_again(node: SimNode):
    node.sim("fault", "lost-gpu", "--gpu", "5")
    node.sim("fault", "hot", "--gpu", "1")
    assert node.check("--slurm").stdout.startswith("gpu-count: 7 of 8 GPUs visible")
    node.sim("clear", "lost-gpu")
    assert node.check("--slurm").stdout.startswith("temperature: GPU 1 at 95 C")
    node.sim("clear", "all")
    assert node.check("--slurm").returncode == 0


def test_application_xids_are_reported_and_old_xids_ignored(node: SimNode):
    node.sim("fault", "xid", "--gpu", "1", "--xid", "13")
    node.sim("fault", "xid", "--gpu", "2", "--xid", "31")
    old = {"xid": 48, "time": int(time.time()) - 7200, "message": "Double Bit ECC Error"}
    node.sim("set", "gpus.3.xid_events", json.dumps([old]))
    rc, report = node.report("--only", "xid")
    assert rc == 0, report
    assert message(report, "xid") == (
        "warning: application errors, not drained: XID 13 on PCI:0000:2a:00 (GPU 1); XID 31 on PCI:0000:3a:00 (GPU 2)"
        " (last 3600 s)"
    )
    node.config["xid_window_s"] = 3 * 3600
    rc, report = node.report("--only", "xid")
    assert rc == 1
    assert message(report, "xid").startswith(
        "XID 48 on PCI:0000:5d:00 (GPU 3): Double Bit ECC Error. [NVIDIA: WORKFLOW_XID_48, then WORKFLOW_XID_48; kept"
    )


def test_a_hardware_xid_stays_through_a_reboot_until_cleared(node: SimNode):
    """What Slurm's health program reads: an Xid 119 drains; a reboot (a new, empty kernel log) and the window
    passing change nothing; heal or an operator (--clear-sticky) ends it and says what it ended."""
    node.sim("fault", "xid", "--gpu", "4", "--xid", "119")
    first = node.check("--slurm")
    assert first.returncode == 3  # a failure the node keeps (hardware): Slurm's health program requeues its jobs
    assert first.stdout.startswith("xid: XID 119 on PCI:0000:9a:00 (GPU 4): Timeout after 6s of waiting for RPC")
    assert "[NVIDIA: RESET_GPU, then INVESTIGATE_SW; kept since " in first.stdout
    node.sim("boot")  # the stand-in's reboot: the kernel log starts anew
    assert node.tool("gpu-sim", "kernel-log").stdout == ""
    # (after a boot the stand-in's Fabric Manager has yet to train the fabric: only the xid check is asked)
    assert node.check("--slurm", "--only", "xid").stdout == first.stdout
    node.config["xid_window_s"] = 1
    assert node.check("--slurm", "--only", "xid").stdout == first.stdout
    cleared = node.check("--clear-sticky", "corectl resume")
    assert cleared.returncode == 0
    assert cleared.stdout.startswith("cleared xid: XID 119 on PCI:0000:9a:00 (GPU 4): Timeout after 6s")
    assert node.check("--slurm", "--only", "xid").returncode == 0
    assert node.check("--clear-sticky", "again", "--json").stdout.count('"cleared": []') == 1


def test_an_unknown_xid_class_is_refused(node: SimNode):
    node.config["xid_classes"] = {"13": "harmless"}
    done = node.check("--check-config")
    assert done.returncode == 2
    assert 'xid_classes.13: unknown class "harmless" (known: ignore, application, hardware)' in done.stderr


def test_gpu_off_the_bus_with_and_without_its_xid(node: SimNode, tmp_path: Path):
    """Slurm's drain reason for a GPU lost at probe time, and the same GPU with its Xid 79 from the stand-in."""
    fallen = (SAMPLES / "dmesg-fallen-off-bus.nvsentinel-155.log").read_text().replace("0000:b3:00", "0000:18:00")
    log = tmp_path / "kernel.log"
    log.write_text(fallen)
    node.config["xid_command"] = ["cat", str(log)]
    slurm = node.check("--slurm", "--only", "xid")
    assert slurm.returncode == 3  # kept (hardware)
    assert slurm.stdout.startswith(
        "xid: GPU on PCI:0000:18:00 has fallen off the bus and is not responding to commands (PCI ID 10de:26b5); "
        "no Xid 79 logged for it [NVIDIA: RESTART_BM, then CONTACT_SUPPORT; kept since "
    )
    # GPU 0 of the stand-in is on bus 18: with its Xid 79 in the same log (kept failures ended first) the GPU is
    # reported once, as the Xid
    assert node.check("--clear-sticky", "test").returncode == 0
    node.sim("fault", "xid", "--gpu", "0", "--xid", "79")
    log.write_text(node.tool("gpu-sim", "kernel-log").stdout + fallen)
    slurm = node.check("--slurm", "--only", "xid")
    assert slurm.stdout.startswith("xid: XID 79 on PCI:0000:18:00 (GPU 0): GPU has fallen off the bus. [NVIDIA: REST")
    assert "more kept" not in slurm.stdout


def test_kernel_log_is_the_kernel_format(node: SimNode):
    node.sim("fault", "xid", "--gpu", "4", "--xid", "79")
    line = node.tool("gpu-sim", "kernel-log").stdout.strip()
    # as drivers 535+ log it (tests/samples/dmesg-xid-79.akash-support-209.log): lower-case bus, pid and name
    assert line == "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert node.tool("gpu-sim", "kernel-log", "--since", "3600").stdout.strip() == line
    node.sim("set", "gpus.4.xid_events.0.time", str(int(time.time()) - 7200))
    assert node.tool("gpu-sim", "kernel-log", "--since", "3600").stdout == ""


def test_dcgm_diag(node: SimNode):
    node.env["HEALTH_HOSTENGINE_PORT"] = "1"  # nothing listens there
    rc, report = node.report("--only", "dcgm-diag", "--level", "1")
    assert rc == 1
    assert "dcgmi diag -r 1 failed (rc 255)" in message(report, "dcgm-diag")
    node.start_hostengine()
    rc, report = node.report("--only", "dcgm-diag", "--level", "1")
    assert rc == 0, report
    assert message(report, "dcgm-diag") == "dcgmi diag -r 1 passed"
    assert node.report("--only", "dcgm-diag")[1]["checks"][0]["status"] == "skip"  # level 0 in the settings
    node.sim("fault", "xid", "--gpu", "4")
    rc, report = node.report("--only", "dcgm-diag", "--level", "2")
    assert rc == 1
    assert message(report, "dcgm-diag").startswith("dcgmi diag -r 2 failed: GPU 4: XID 79 at ")


def test_dcgm_health_watches_are_set_again_and_name_the_gpu_and_system(node: SimNode):
    """Issue 47: DCGM's background health watches. A host engine that (re)started has none: the check sets them and
    says so; a Warning is said and drains nothing; a Failure fails the node, naming the GPU and the system."""
    node.config["dcgm_health"] = True
    node.start_hostengine()
    rc, report = node.report("--only", "dcgm-health")
    assert rc == 0 and message(report, "dcgm-health").startswith("warning: DCGM health watches were not set"), report
    rc, report = node.report("--only", "dcgm-health")
    assert (rc, message(report, "dcgm-health")) == (0, "DCGM health watches: healthy")
    node.sim("fault", "dcgm-pcie-replay", "--gpu", "3")
    rc, report = node.report("--only", "dcgm-health")
    assert rc == 0, report
    assert message(report, "dcgm-health").startswith(
        "warning: DCGM health: GPU 3 PCIe system: Warning: Detected more than 8 PCIe replays per minute for GPU 3"
    )
    node.sim("fault", "dcgm-dbe", "--gpu", "5")
    rc, report = node.report("--only", "dcgm-health")
    assert rc == 1
    assert message(report, "dcgm-health") == (
        "DCGM health: GPU 5 Memory system: Failure: Detected 1 volatile double-bit ECC error(s) in GPU 5. Drain the"
        " GPU and reset it or reboot the node."
    )
    node.sim("clear", "all")
    assert node.report("--only", "dcgm-health")[0] == 0


def test_gpudirect_needs_its_module_loaded(node: SimNode, tmp_path: Path):
    def gpudirect() -> tuple[str, str]:
        rc, report = node.report("--only", "gpudirect")
        (check,) = report["checks"]
        assert rc == (1 if check["status"] == "fail" else 0)
        return check["status"], check["message"]

    assert gpudirect() == ("pass", "nvidia_peermem loaded")
    node.config["gpudirect_module"] = "nvidia-peermem"  # the modprobe name: the kernel lists it with '_'
    assert gpudirect() == ("pass", "nvidia_peermem loaded")
    node.sim("rmmod", "nvidia-peermem")
    assert gpudirect() == ("fail", "nvidia_peermem not loaded (GPUDirect RDMA)")
    node.sim("modprobe", "nvidia_peermem")
    assert gpudirect() == ("pass", "nvidia_peermem loaded")
    node.sim("boot")  # not in modules-load.d: a reboot forgets it
    assert gpudirect() == ("fail", "nvidia_peermem not loaded (GPUDirect RDMA)")
    # a module list spelling the name with '-' still counts (the names are the same to the kernel)
    listing = tmp_path / "proc-modules"
    listing.write_text("nvidia_uvm 2068480 0 - Live 0x0000000000000000\nnvidia-peermem 16384 0 - Live 0x0\n")
    node.config["modules_file"] = str(listing)
    node.config["gpudirect_module"] = "nvidia_peermem"
    assert gpudirect() == ("pass", "nvidia-peermem loaded")
    listing.write_text("nvidia_peermem_x 16384 0 - Live 0x0\n")
    assert gpudirect() == ("fail", "nvidia_peermem not loaded (GPUDirect RDMA)")
    node.config["modules_file"] = str(tmp_path / "missing")
    status, text = gpudirect()
    assert status == "fail"
    assert text.startswith(f"cannot read {tmp_path / 'missing'}: No such file or directory")
    node.config["gpudirect_module"] = ""
    assert gpudirect() == ("skip", "GPUDirect RDMA not asked for")
    # settings files written before the check existed: no keys, no check
    del node.config["gpudirect_module"], node.config["modules_file"]
    assert gpudirect() == ("skip", "GPUDirect RDMA not asked for")


def test_no_gpus_skips_the_gpu_checks(node: SimNode):
    node.config.update(gpu_count=0, ib_ports=0, ib_rate_gbps=0, gpudirect_module="")
    (node.lib / "driver-version").unlink()  # not even a driver
    rc, report = node.report()
    assert rc == 0, report
    skipped = {c["name"] for c in report["checks"] if c["status"] == "skip"}
    assert skipped >= set(CHECK_ORDER) - {"mounts", "nvme", "services", "clock", "aer", "edac"}  # the host's own
    assert message(report, "gpu-count") == "no GPUs expected (gpu_count 0)"


def test_missing_tools_fail_with_a_clear_message(node: SimNode):
    (node.bin / "chronyc").unlink()
    (node.bin / "nv-fabricmanager").unlink()
    env_path = node.env["PATH"]
    node.env["PATH"] = str(node.bin)  # the checker adds the standard directories itself (Slurm's bare environment)
    try:
        rc, report = node.report("--only", "fm-version,clock")
    finally:
        node.env["PATH"] = env_path
    assert rc == 1
    fm = message(report, "fm-version")
    assert fm == "nv-fabricmanager not found" or fm.startswith("nv-fabricmanager --version failed")
    if not any(Path(d, "chronyc").exists() for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin")):
        assert message(report, "clock") == "chronyc not found (clock check is on; is chrony installed?)"


def test_bad_configuration_and_usage_exit_2(node: SimNode, tmp_path: Path):
    node.config["gpu_count"] = "eight"
    result = node.check()
    assert result.returncode == 2
    assert "gpu_count must be int" in result.stderr
    node.config["gpu_count"] = 8
    node.config["bogus"] = 1
    assert "unknown setting 'bogus'" in node.check("--check-config").stderr
    del node.config["bogus"]
    assert node.check("--check-config").returncode == 0
    assert node.check("--only", "gpu-count,nope").returncode == 2
    missing = subprocess.run(
        [sys.executable, str(CHECKER), "--config", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert "No such file or directory" in missing.stderr


def test_json_format(node: SimNode):
    node.sim("fault", "hot", "--gpu", "0")
    rc, report = node.report("--only", "temperature,services,gpu-count")
    assert rc == 1
    assert set(report) == {"node", "ok", "checks"}
    assert report["ok"] is False
    assert [c["name"] for c in report["checks"]] == ["gpu-count", "temperature", "services"]
    for check in report["checks"]:
        assert set(check) >= {"name", "status", "message"}
        assert check["status"] in ("pass", "fail", "skip")
        assert "\n" not in check["message"]
    assert [c["status"] for c in report["checks"]] == ["pass", "fail", "pass"]


# --------------------------------------------------------------------------- Slurm's HealthCheckProgram end to end

FAKE_SCONTROL = """#!/bin/sh
# scontrol show node N -o / scontrol update nodename=N state=drain|resume [reason=...]: state in $HEALTH_SLURM
case "$1" in
show)
    if [ -s "$HEALTH_SLURM/reason" ]; then
        echo "NodeName=dgx01 State=IDLE+DRAIN Reason=$(cat "$HEALTH_SLURM/reason") [root@2026-01-01T00:00:00]"
    else
        echo "NodeName=dgx01 State=IDLE"
    fi ;;
update)
    echo "$*" >> "$HEALTH_SLURM/log"
    for arg in "$@"; do
        case "$arg" in
        reason=*) printf '%s' "${arg#reason=}" > "$HEALTH_SLURM/reason" ;;
        state=resume) : > "$HEALTH_SLURM/reason" ;;
        esac
    done ;;
requeue)
    # as Slurm answers: a job submitted with --no-requeue (listed in $HEALTH_SLURM/no-requeue) is refused
    if grep -qx "$2" "$HEALTH_SLURM/no-requeue" 2>/dev/null; then
        echo "slurm_requeue error: Requested operation is presently disabled" >&2
        exit 1
    fi
    echo "$*" >> "$HEALTH_SLURM/log" ;;
esac
"""
# squeue --noheader --nodelist=N --states=RUNNING --format=%i: the jobs in $HEALTH_SLURM/jobs
FAKE_SQUEUE = """#!/bin/sh
echo "$*" > "$HEALTH_SLURM/squeue-args"
cat "$HEALTH_SLURM/jobs" 2>/dev/null
"""


def render(template: Path, **variables: object) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["bool"] = lambda value: value if isinstance(value, bool) else str(value).lower() in ("true", "yes", "1")
    return env.from_string(template.read_text()).render(ansible_managed="Ansible managed", **variables)


def test_slurm_health_program_drains_with_the_check_name_and_resumes(node: SimNode, tmp_path: Path):
    health_d = tmp_path / "health.d"
    health_d.mkdir()
    slurm = tmp_path / "slurm"
    slurm.mkdir()
    node.env["HEALTH_SLURM"] = str(slurm)
    node._tool("scontrol", FAKE_SCONTROL)
    node._tool("hostname", "#!/bin/sh\necho dgx01\n")
    config = node.write_config()
    program = tmp_path / "corectl-node-health"
    paused = tmp_path / "health-paused"
    program.write_text(
        render(
            ROOT / "roles/slurm/templates/corectl-node-health.j2",
            slurm_health_check_dir=health_d,
            slurm_health_check_pause_file=paused,
            slurm_drain_reason_module=ROOT / "roles/slurm/files/corectl_drain_reason.py",  # common.yml installs it
            slurm_requeue_on_hardware_drain=True,
        )
    )
    wrapper = health_d / "10-corectl"
    wrapper.write_text(
        render(
            ROOT / "roles/node_health/templates/10-corectl.j2",
            node_health_program=f"{sys.executable} {CHECKER}",
            node_health_config=config,
            node_health_slurm_dcgm_diag_level=0,
        )
    )
    wrapper.chmod(0o755)

    def health() -> tuple[int, str]:
        run = subprocess.run(["sh", str(program)], env=node.env, capture_output=True, timeout=120, check=False)
        reason = (slurm / "reason").read_text() if (slurm / "reason").exists() else ""
        return run.returncode, reason

    assert health() == (0, "")
    node.sim("fault", "lost-gpu", "--gpu", "5")
    rc, reason = health()
    assert rc == 1
    assert reason.startswith("corectl-health: gpu-count: 7 of 8 GPUs visible to nvidia-smi")
    node.sim("clear", "all")
    assert health() == (0, "")
    assert (slurm / "log").read_text().splitlines()[-1] == "update nodename=dgx01 state=resume"

    # a check script printing a plain message keeps its file name as the check (molecule's injected fault)
    fault = health_d / "50-molecule-fault"
    fault.write_text("#!/bin/sh\necho injected fault\nexit 1\n")
    fault.chmod(0o755)
    assert health() == (1, "corectl-health: 50-molecule-fault: injected fault")
    fault.unlink()
    assert health() == (0, "")

    # burn-in resumed the node into its reservation: until the pause file's time a failure drains nothing
    node.sim("fault", "lost-gpu", "--gpu", "5")
    paused.write_text(f"{int(time.time()) + 600}\n")
    assert health() == (1, "")
    paused.write_text(f"{int(time.time()) - 1}\n")  # its time is over: drained as ever
    assert health()[1].startswith("corectl-health: gpu-count: 7 of 8 GPUs visible")
    paused.write_text("garbage\n")  # not a time: no pause
    node.sim("clear", "all")
    assert health() == (0, "")

    # issue 47: a hardware failure (one the node keeps: an Xid of the hardware class) drains the node and then
    # requeues its running batch jobs; a job submitted with --no-requeue is refused by Slurm and keeps running.
    # A failure the node does not keep (a GPU lost from nvidia-smi's view) drains without requeueing.
    node._tool("squeue", FAKE_SQUEUE)
    (slurm / "jobs").write_text("4101\n4102_3\n4103\n")
    (slurm / "no-requeue").write_text("4103\n")
    before = (slurm / "log").read_text()
    node.sim("fault", "lost-gpu", "--gpu", "5")
    rc, reason = health()
    assert rc == 1 and "requeue" not in (slurm / "log").read_text()
    assert not reason.endswith(" (kept)"), reason  # no spare takes its place: it passes again by itself
    node.sim("clear", "all")
    assert health() == (0, "")
    before = (slurm / "log").read_text()
    node.sim("fault", "xid", "--gpu", "0", "--xid", "79")
    rc, reason = health()
    assert rc == 1 and reason.startswith("corectl-health: xid: XID 79 on PCI:0000:18:00")
    assert reason.endswith(" (kept)"), reason  # out for good: the controller's corectl-spares covers it
    assert (slurm / "squeue-args").read_text().split() == [
        "--noheader", "--nodelist=dgx01", "--states=RUNNING", "--format=%i"
    ]  # fmt: skip
    done = (slurm / "log").read_text()[len(before) :].splitlines()
    assert done == [
        f"update nodename=dgx01 state=drain reason={reason}",
        "requeue 4101",
        f"update jobid=4101 admincomment=requeued by corectl: dgx01 drained: {reason}",
        "requeue 4102_3",
        f"update jobid=4102_3 admincomment=requeued by corectl: dgx01 drained: {reason}",
    ]
    assert health() == (1, reason) and (slurm / "log").read_text()[len(before) :].splitlines() == done  # once
    node.check("--clear-sticky", "test")
    node.sim("clear", "all")
    assert health() == (0, "")
    (slurm / "jobs").unlink()

    # an operator's drain is kept through a failure and a pass: the hook asks corectl_drain_reason whose it is
    (slurm / "reason").write_text("corectl drain: rack 4 maintenance")
    updates = (slurm / "log").read_text()
    node.sim("fault", "lost-gpu", "--gpu", "5")
    assert health() == (1, "corectl drain: rack 4 maintenance")
    node.sim("clear", "all")
    assert health() == (0, "corectl drain: rack 4 maintenance")
    assert (slurm / "log").read_text() == updates  # neither drained again nor resumed


def test_an_idle_gpu_with_a_lowered_link_passes(node: SimNode):
    """An idle GPU lowers its PCIe link to save power: judged only while busy."""
    node.sim("fault", "pcie-narrow", "--gpu", "3")
    node.sim("set", "gpus.3.throttle_reasons", '["GpuIdle"]')
    rc, report = node.report("--only", "pcie")
    assert rc == 0, report
    assert message(report, "pcie") == (
        "7 busy GPUs at their maximum PCIe link, replays <= 100; 1 idle GPUs not judged (an idle GPU lowers its link)"
    )


def test_ib_error_counters_that_jump_and_links_that_flap_are_kept(node: SimNode):
    """Issue 33: counters compared with the last run's (kept in the state directory); a jump or a flap is
    kept like a hardware Xid; a boot zeroes the counters and starts anew."""

    def ib_errors() -> tuple[int, str]:
        rc, report = node.report("--only", "ib-errors")
        return rc, message(report, "ib-errors")

    assert ib_errors() == (0, "8 IB ports' error counters read (first run: nothing to compare)")
    rc, said = ib_errors()
    assert rc == 0 and said.startswith("no IB error counter jumped and no link went down on 8 ports since "), said
    node.sim("fault", "ib-errors", "--device", "mlx5_3")
    rc, said = ib_errors()
    assert rc == 1
    assert re.fullmatch(
        r"mlx5_3/1 symbol_error \+1000 since \S+ \(max 10\) \[kept since \S+ until corectl heal or corectl resume\]",
        said,
    ), said
    assert ib_errors() == (1, said)  # no new errors, still kept
    node.sim("fault", "ib-flap", "--device", "mlx5_0")
    rc, flapped = ib_errors()
    assert rc == 1 and flapped.startswith("mlx5_0/1 went down 2 times since ") and "(and 1 more kept)" in flapped
    assert node.check("--clear-sticky", "test").stdout.count("cleared ib-errors: ") == 2
    assert ib_errors()[0] == 0
    node.sim("boot")  # the counters start from 0: lower than last time is no jump
    assert ib_errors()[0] == 0


def test_an_uncorrectable_memory_error_is_kept_through_a_boot(node: SimNode):
    """Issue 33: EDAC's uncorrectable count fails the node; the kernel's count starts from 0 at a boot, the
    record does not."""
    rc, report = node.report("--only", "edac")
    assert (rc, message(report, "edac")) == (
        0,
        "no uncorrectable memory errors on 2 memory controllers (0 corrected), none logged in the last 3600 s",
    )
    node.sim("fault", "edac-ue")
    rc, report = node.report("--only", "edac")
    assert rc == 1
    assert message(report, "edac").startswith("mc1: 1 uncorrectable memory errors (max 0) [kept since ")
    assert node.check("--clear-sticky", "test").stdout.startswith("cleared edac: mc1: 1 uncorrectable memory errors")
    assert node.report("--only", "edac")[0] == 0  # the same count, ended by an operator: not judged again
    node.sim("fault", "edac-ue")  # it grows
    assert node.report("--only", "edac")[0] == 1
    node.sim("boot")  # the kernel's count starts from 0; the record stays
    assert node.report("--only", "edac")[0] == 1


def test_a_memory_error_that_crashed_the_node_is_found_after_the_boot_in_the_persistent_journal(node: SimNode):
    """Issue 47: the node crashed of an uncorrectable error and booted: EDAC's counts are 0, only the journal (which
    keeps the boots before this one) holds the kernel's line. The first check after the boot fails, naming the
    memory controller and the DIMM; ended by an operator, the same line is not judged again."""
    node.sim("fault", "edac-ue-logged")
    node.sim("set", "journal.0.time", str(int(time.time()) - 60))  # logged a minute before the boot
    node.sim("boot")
    rc, report = node.report("--only", "edac")
    assert rc == 1
    assert message(report, "edac").startswith(
        "mc1: 1 uncorrectable memory read error logged by the kernel on CPU_SrcID#0_MC#1_Chan#0_DIMM#0 [kept since "
    )
    assert node.check("--clear-sticky", "test").stdout.startswith("cleared edac: mc1: 1 uncorrectable memory read")
    rc, report = node.report("--only", "edac")  # (the window read starts at the clear)
    assert rc == 0 and re.search(r"\(0 corrected\), none logged in the last \d s$", message(report, "edac")), report


def test_a_link_downed_counter_at_its_maximum_fails_until_the_counters_are_reset(node: SimNode):
    """Issue 47: link_downed at 255 can count no more flaps: the port can no longer be judged, so it fails (kept),
    from the first run on, naming the port; a reset of the counters (perfquery -R) and a clear end it."""
    assert node.report("--only", "ib-errors")[0] == 0  # a run before: the counters at 0
    node.sim("fault", "ib-saturated", "--device", "mlx5_2")
    rc, report = node.report("--only", "ib-errors")
    assert rc == 1  # one record: the maximum, not also a jump of 255 flaps
    said = message(report, "ib-errors")
    assert said.startswith("mlx5_2/1 link_downed at its maximum 255: its link flaps can no ")
    assert "more kept" not in said
    node.sim("clear", "ib-saturated", "--device", "mlx5_2")
    node.check("--clear-sticky", "test")
    assert node.report("--only", "ib-errors")[0] == 0

"""Real NVIDIA tool output (tests/samples, sources in tests/samples/SOURCES.md) against the checker and the stand-ins.

Issue 12, "keep the stand-ins honest": the other tests only ever run the health checker against our own stand-ins,
so a wrong stand-in format would hide a wrong parser. Here (a) the checker's own parsers read output captured on
real machines and must get the exact values, and (b) the stand-ins' output must have the same line shapes and key
names as the real samples (regexes and key sets, never machine-specific values).

Each disagreement these tests found (MIG Xid lines, the Xid line's case and fields, nvidia-smi -q's value column and
nesting, nvlink -e's blank lines, dcgmi's table widths and rows) was fixed in the checker or the stand-in. Issue
"Health that heals" (part 4) added the faults real nodes print that the checker missed: Xid lines of a MIG compute
instance, a GPU fallen off the bus with no Xid line, chrony serving its own clock, renamed NVLink counters. Files
with CONSTRUCTED in their name are not real output (no capture was found): SOURCES.md says what they model.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# the stand-in tools and the checker, as the checker's own tests run them
from conftest import CHECKER, ROOT, SAMPLES, STANDIN, load_script, shipped, xid_catalog
from conftest import CHECKER_TOOLS as TOOLS
from conftest import STANDIN_DRIVER as DRIVER

hc = shipped(CHECKER, "health_check")


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


# every canned node's state directory, removed when the tests end
STATE_ROOT = tempfile.TemporaryDirectory(prefix="corectl-sticky-")


class CannedNode(hc.Node):
    """The checker's Node, answering commands from canned (real) output instead of running them."""

    def __init__(self, outputs: dict[tuple[str, ...], str], driver: str | None = None, **settings: object) -> None:
        config = json.loads(json.dumps({key: default for key, (_kind, default) in hc.SETTINGS.items()}))
        # the shipped catalog, and failures kept in a directory of this node's own
        config.update(xid_catalog=xid_catalog(), state_dir=tempfile.mkdtemp(dir=STATE_ROOT.name))
        config.update(settings)
        super().__init__(config)
        self.outputs = outputs
        self.loaded_driver = driver

    def run(self, *argv: str, timeout: float | None = None) -> object:
        if argv in self.outputs:
            return hc.Result(0, self.outputs[argv], "")
        return hc.Result(2, "", f"not canned: {argv}")

    def driver(self) -> str:
        return self.loaded_driver or super().driver()


class Sim:
    """A simulated DGX H100 in tmp_path, like tests/integration/test_standin.py's Node: the stand-in
    tools and their state."""

    def __init__(self, root: Path) -> None:
        lib = root / "lib"
        lib.mkdir()
        for name, version in (("driver-version", DRIVER), ("fm-version", DRIVER), ("dcgm-version", "4.2.3")):
            (lib / name).write_text(version + "\n")
        self.sysfs = root / "sysfs"
        self.env = dict(
            os.environ,
            GPU_SIM_STATE=str(root / "etc" / "gpus.json"),
            GPU_SIM_LIB=str(lib),
            GPU_SIM_RUN=str(root / "run"),
            GPU_SIM_SYSFS=str(self.sysfs),
            GPU_SIM_DEV=str(root / "dev"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        self.run("gpu-sim", "init", "--hostname", "dgx01")

    def command(self, tool: str, *args: str) -> list[str]:
        return [sys.executable, str(STANDIN / TOOLS[tool]), *args]

    def run(self, tool: str, *args: str, check: int | None = 0) -> str:
        result = subprocess.run(
            self.command(tool, *args), env=self.env, capture_output=True, text=True, timeout=30, check=False
        )
        assert check is None or result.returncode == check, f"{tool} {args}: {result.stdout}{result.stderr}"
        return result.stdout


@pytest.fixture
def sim(tmp_path: Path) -> Sim:
    return Sim(tmp_path)


@pytest.fixture
def engine(sim: Sim) -> Iterator[str]:
    """A running stand-in nv-hostengine; yields the --host argument for dcgmi."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        host = f"127.0.0.1:{sock.getsockname()[1]}"
    cmd = sim.command("nv-hostengine", "-n", "--service-account", "nvidia-dcgm", "-p", host.split(":")[1])
    proc = subprocess.Popen(cmd, env=sim.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while sim.run("dcgmi", "discovery", "-l", "--host", host, check=None).startswith("Error"):
            assert time.monotonic() < deadline, "stand-in nv-hostengine did not start"
            time.sleep(0.05)
        yield host
    finally:
        proc.kill()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- (a) the checker reads real output

H100_8GPU_BUSES = ["19", "3B", "4C", "5D", "9B", "BB", "CB", "DB"]


def test_fabric_state_of_a_real_h100():
    report = sample("nvidia-smi-q.h100-sxm.545.23.08.txt")
    assert hc.fabric_states(report) == [("00000000:19:00.0", "Completed", "Success")]
    node = CannedNode({("nvidia-smi", "-q"): report}, gpu_count=1, nvswitch=True)
    assert hc.check_fabric(node) == "fabric Completed on 1 GPUs"


def test_fabric_state_of_a_real_8_gpu_h100_node():
    report = sample("nvidia-smi-q.h100-8gpu.535.161.08.trimmed.txt")
    assert hc.fabric_states(report) == [(f"00000000:{bus}:00.0", "Completed", "Success") for bus in H100_8GPU_BUSES]
    node = CannedNode({("nvidia-smi", "-q"): report}, gpu_count=8, nvswitch=True)
    assert hc.check_fabric(node) == "fabric Completed on 8 GPUs"


def test_fabric_health_subsection_does_not_hide_state():
    # the real lines come from `nvidia-smi -q | grep -C3`, which drops the GPU header: we add one of our own
    report = "GPU 00000000:18:00.0\n" + sample("nvidia-smi-q-fabric.grep-C3.dra-driver-626.txt")
    assert hc.fabric_states(report) == [("00000000:18:00.0", "Completed", "Success")]


@pytest.mark.parametrize(
    ("name", "gpus", "links", "speed"),
    [
        ("nvidia-smi-nvlink-s.a100-sxm4-80gb.txt", 8, 12, "25 GB/s"),
        ("nvidia-smi-nvlink-s.h100-80gb-hbm3.txt", 2, 18, "26.562 GB/s"),
    ],
)
def test_nvlink_status_of_real_gpus(name: str, gpus: int, links: int, speed: str):
    status = hc.nvlink_status(sample(name))
    assert status == {gpu: dict.fromkeys(range(links), speed) for gpu in range(gpus)}
    node = CannedNode({("nvidia-smi", "nvlink", "-s"): sample(name)}, gpu_count=gpus, nvlink_links=links)
    assert hc.check_nvlink(node) == f"{gpus} GPUs x {links} links active (error counters unavailable)"


def test_nvlink_error_counters_of_a_real_h100():
    counters = hc.nvlink_counters(sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt"))
    names = ["Replay Errors", "Recovery Errors", "CRC Errors"]
    assert counters == [(0, link, name, "0") for link in (0, 1, 17) for name in names]
    # every counter name of the real H100 is one the check knows and compares: no warning
    assert hc.nvlink_error_check(sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt"), 100) == ([], [])


def nvlink_node(errors: str, links: int = 18) -> CannedNode:
    """A node whose 1 GPU has `links` active links (the real H100 -s lines) and the given nvlink -e output."""
    status = "\n".join(sample("nvidia-smi-nvlink-s.h100-80gb-hbm3.txt").split("GPU 1:")[0].splitlines()[: links + 1])
    outputs = {("nvidia-smi", "nvlink", "-s"): status + "\n", ("nvidia-smi", "nvlink", "-e"): errors}
    return CannedNode(outputs, gpu_count=1, nvlink_links=links)


def test_known_nvlink_counters_keep_failing_above_the_limit():
    real = sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt")
    assert hc.check_nvlink(nvlink_node(real)) == "1 GPUs x 18 links active"
    worn = real.replace("Link 17: CRC Errors: 0", "Link 17: CRC Errors: 5000")  # the real line, a high count
    with pytest.raises(hc.CheckFailed, match=r"^NVLink error counters above 100: GPU 0 link 17 CRC Errors 5000$"):
        hc.check_nvlink(nvlink_node(worn))


NEWER_NVLINK = "nvidia-smi-nvlink-e.newer-counter-names.CONSTRUCTED.txt"


def test_unknown_nvlink_counter_names_warn_without_failing():
    # CONSTRUCTED sample (SOURCES.md): the counter names newer drivers print, in the real line shape
    text = sample(NEWER_NVLINK)
    counters = hc.nvlink_counters(text)
    assert len(counters) == 32 and {link for _gpu, link, _name, _value in counters} == {0, 1}
    assert (0, 0, "FEC Errors - 0", "36140749276") in counters and (0, 1, "Effective BER", "15e-255") in counters
    over, unchecked = hc.nvlink_error_check(text, 100)
    assert over == []  # a healthy link's billions of corrected codewords must not fail the node
    assert unchecked[:3] == ["Malformed packet Errors", "Buffer overrun Errors", "Rx Errors"] and len(unchecked) == 16
    message = hc.check_nvlink(nvlink_node(text))  # passes, and says what it could not check
    assert message == (
        "1 GPUs x 18 links active (warning: NVLink counters this check does not know, not checked: "
        "Malformed packet Errors; Buffer overrun Errors; Rx Errors; and 13 more)"
    )


def test_nvlink_counters_of_both_generations_on_one_node():
    # known counters still judged next to unknown ones; the failure names only the known counter
    text = sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt").replace("CRC Errors: 0", "CRC Errors: 101", 1)
    text += sample(NEWER_NVLINK).replace("GPU 0:", "GPU 1:")
    with pytest.raises(hc.CheckFailed, match=r"^NVLink error counters above 100: GPU 0 link 0 CRC Errors 101$"):
        hc.check_nvlink(nvlink_node(text))


def test_nvlink_errors_with_no_counter_line_warn():
    # a driver that prints its counters in a shape nothing here parses must not pass in silence
    text = sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt").replace(": 0", " = 0")
    assert hc.nvlink_counters(text) == []
    assert hc.check_nvlink(nvlink_node(text)) == (
        "1 GPUs x 18 links active (warning: NVLink counters this check does not know, not checked: "
        "no Link N: <counter>: <value> line)"
    )


@pytest.mark.parametrize(
    ("name", "events"),
    [
        ("dmesg-xid-79.akash-support-209.log", [("PCI:0000:a1:00", 79, "GPU has fallen off the bus.", "")]),
        (
            "dmesg-xid.akash-support-244.log",
            [
                ("PCI:0000:00:05", 43, "Ch 00000008", ""),
                ("PCI:0000:00:05", 43, "Ch 00000008", ""),
                ("PCI:0000:00:07", 31, "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted"
                 " @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE", ""),
                ("PCI:0000:00:08", 94, "Contained: SM (0x1). RST: No, D-RST: No", ""),
            ],
        ),
    ],
)  # fmt: skip
def test_xid_events_of_real_kernel_logs(name: str, events: list[tuple[str, int, str, str]]):
    assert hc.xid_events(sample(name)) == events


def test_xid_119_storm_on_a_real_h100_node():
    events = hc.xid_events(sample("dmesg-xid-119.h100-xe9680.log"))
    assert [(pci, xid) for pci, xid, _, _ in events] == [("PCI:0000:9b:00", 119)] * 5
    assert events[-1][2] == (
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) "
        "(0x20803032 0x58c)."
    )


FALLEN_79 = (
    "XID 79 on PCI:0000:a1:00: GPU has fallen off the bus. [NVIDIA: RESTART_BM, then CONTACT_SUPPORT; kept since "
)


def test_xid_check_on_real_kernel_logs():
    """Classed by NVIDIA's catalog: 79 is hardware (drained and kept); 43 is IGNORE; 31 and 94 are RESTART_APP
    (reported, not drained)."""
    log = sample("dmesg-xid-79.akash-support-209.log")
    node = CannedNode({("journal",): log}, gpu_count=8, xid_command=["journal"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(node)
    assert str(failed.value).startswith(FALLEN_79), failed.value
    assert str(failed.value).endswith(" until corectl heal or corectl resume]")
    node = CannedNode({("journal",): sample("dmesg-xid.akash-support-244.log")}, gpu_count=8, xid_command=["journal"])
    assert hc.check_xid(node) == (
        "warning: application errors, not drained: XID 31 on PCI:0000:00:07; XID 94 on PCI:0000:00:08 (last 3600 s)"
    )


def test_a_hardware_xid_is_kept_after_the_log_window_until_cleared():
    storm = CannedNode({("journal",): sample("dmesg-xid-119.h100-xe9680.log")}, gpu_count=8, xid_command=["journal"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(storm)
    first = str(failed.value)
    assert first.startswith(
        "XID 119 on PCI:0000:9b:00: Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103"
        " (GSP_RM_ALLOC) (0x2081 0x4). [NVIDIA: RESET_GPU, then INVESTIGATE_SW; kept since "
    ), first
    assert "more kept" not in first  # five lines, one GPU, one Xid: one record, the first line's
    # the window has passed (or the node rebooted): the log is empty, the node still fails, with the same record
    later = CannedNode({("journal",): ""}, gpu_count=8, xid_command=["journal"], state_dir=storm.config["state_dir"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(later)
    assert str(failed.value) == first
    # heal or an operator ends it; what was ended is returned, and the node passes
    cleared = hc.clear_sticky(later.config, "test")
    assert [(r["check"], r["key"]) for r in cleared] == [("xid", "xid 119 pci:0000:9b:00")]
    assert hc.check_xid(later).startswith("no XID errors in the last ")
    # after a clear only what the kernel logged since is read: the window shrinks to the seconds since (and 2 more)
    assert 2 <= hc.seconds_since_clear(later.config, 3600) <= 4


@pytest.mark.parametrize(
    ("line", "outcome"),
    [
        # as a driver logs it (NVIDIA developer forum, SOURCES.md) and as the catalog describes it
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
         "fail: XID 154 on PCI:0000:01:00: GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
         " [driver: GPU Reset Required; kept since "),
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
         "fail: XID 154 on PCI:0000:01:00: GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
         " [driver: Node Reboot Required; kept since "),
        # back to none: nothing to do
        ("NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
         "pass: no XID errors in the last 3600 s"),
    ],
)  # fmt: skip
def test_xid_154_is_classed_by_the_recovery_action_it_names(line: str, outcome: str):
    node = CannedNode({("journal",): line}, gpu_count=8, xid_command=["journal"])
    try:
        result = "pass: " + hc.check_xid(node)
    except hc.CheckFailed as exc:
        result = f"fail: {exc}"
    assert result.startswith(outcome), result


def test_the_sites_xid_classes_win_over_the_catalog():
    log = sample("dmesg-xid.akash-support-244.log")
    node = CannedNode({("journal",): log}, gpu_count=8, xid_command=["journal"], xid_classes={"31": "hardware"})
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(node)
    assert str(failed.value).startswith("XID 31 on PCI:0000:00:07: Ch 00000008, intr 00000000. MMU Fault:")
    node = CannedNode({("journal",): log}, gpu_count=8, xid_command=["journal"], xid_classes={"31": "ignore"})
    assert hc.check_xid(node) == "warning: application errors, not drained: XID 94 on PCI:0000:00:08 (last 3600 s)"


def test_xid_on_a_mig_instance_is_seen():
    events = hc.xid_events(sample("xid-mig-examples.nvidia-docs.txt"))
    assert [xid for _pci, xid, _, _ in events] == [94, 94, 95]
    # attributed to the GPU by its bus; the MIG instance is kept for the message
    assert events[0] == ("PCI:0000:01:00", 94, "Contained: CE User Channel (0x9). RST: No, D-RST: No", "GPU-I:05")
    node = CannedNode({("journal",): sample("xid-mig-examples.nvidia-docs.txt").splitlines()[0]}, gpu_count=1,
                      xid_command=["journal"])  # fmt: skip
    # a contained error is the application's (RESTART_APP): reported with its MIG instance, not drained
    assert hc.check_xid(node) == (
        "warning: application errors, not drained: XID 94 on PCI:0000:01:00 (GPU-I:05) (last 3600 s)"
    )
    # an uncontained one (RESET_GPU) drains, and is kept per GPU and instance
    node = CannedNode({("journal",): sample("xid-mig-examples.nvidia-docs.txt")}, gpu_count=1, xid_command=["journal"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(node)
    assert str(failed.value).startswith("XID 95 on PCI:0000:01:00")


def test_xid_on_a_mig_compute_instance_is_seen():
    # CONSTRUCTED sample (SOURCES.md): the driver's GPU-I + GPU-CI format, which no real capture showed
    events = hc.xid_events(sample("xid-mig-gpu-ci.CONSTRUCTED.from-kernel_rc.txt"))
    detail = "Contained: CE User Channel (0x9). RST: No, D-RST: No"  # pid= and name= dropped as for any Xid
    assert events == [
        ("PCI:0000:01:00", 94, detail, "GPU-I:05 GPU-CI:00"),
        ("PCI:0000:01:00", 94, detail, "GPU-I:05"),
    ]
    node = CannedNode({("journal",): sample("xid-mig-gpu-ci.CONSTRUCTED.from-kernel_rc.txt")}, gpu_count=1,
                      xid_command=["journal"])  # fmt: skip
    assert hc.check_xid(node) == (
        "warning: application errors, not drained: XID 94 on PCI:0000:01:00 (GPU-I:05 GPU-CI:00);"
        " XID 94 on PCI:0000:01:00 (GPU-I:05) (last 3600 s)"
    )


FALLEN = "dmesg-fallen-off-bus.nvsentinel-155.log"
KEPT_79 = " [NVIDIA: RESTART_BM, then CONTACT_SUPPORT; kept since "
FALLEN_MESSAGE = (
    "GPU on PCI:0000:b3:00 has fallen off the bus and is not responding to commands (PCI ID 10de:26b5); "
    "no Xid 79 logged for it"
)


def test_gpu_fallen_off_the_bus_without_an_xid_line():
    text = sample(FALLEN)
    assert hc.xid_events(text) == []  # nothing for the Xid parser: this is what used to pass
    assert hc.bus_lost(text) == [
        ("PCI:0000:b3:00", "has fallen off the bus and is not responding to commands (PCI ID 10de:26b5)")
    ]
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(CannedNode({("journal",): text}, gpu_count=8, xid_command=["journal"]))
    assert str(failed.value).startswith(FALLEN_MESSAGE + KEPT_79), failed.value


@pytest.mark.parametrize(
    "shape",
    ["dmesg", "journalctl -o cat", "syslog", "one line"],
)
def test_fallen_off_the_bus_in_every_log_shape(shape: str):
    """The one message in the shapes the log tools give it (built from the real dmesg lines of the sample)."""
    lines = sample(FALLEN).splitlines()[:3]
    bare = [line.split("] ", 1)[-1].strip() for line in lines]  # "NVRM: ..." as the kernel printed it
    text = {
        "dmesg": "\n".join(lines),
        "journalctl -o cat": "\n".join(bare),  # one journal entry, its newlines kept, no prefix
        "syslog": "\n".join(f"Jan  3 07:39:45 dgx01 kernel: [ 1843.308145] {line}" for line in bare),
        "one line": " ".join(bare).replace(" NVRM: ", " ", 2),  # a collector that joins the three
    }[shape]
    assert [pci for pci, _ in hc.bus_lost(text)] == ["PCI:0000:b3:00"]


def test_fallen_off_the_bus_is_not_pinned_on_the_gpu_before():
    # another GPU's probe message just before (osapi.c's "not supported" text, in the shape of the sample): the lost
    # GPU is the one whose own message says so
    before = (
        "[ 1843.300001] NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d04)\n"
        "               NVRM: installed in this system is not supported by the\n"
    )
    assert [pci for pci, _ in hc.bus_lost(before + sample(FALLEN))] == ["PCI:0000:b3:00"]


def test_fallen_off_the_bus_with_its_xid_79_is_reported_once():
    # the real run-time pair: Xid 79 and "NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus." on the same GPU
    log = sample("dmesg-xid-79.akash-support-209.log")
    assert hc.bus_lost(log) == [("PCI:0000:a1:00", "has fallen off the bus")]
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(CannedNode({("journal",): log}, gpu_count=8, xid_command=["journal"]))
    assert str(failed.value).startswith(FALLEN_79)  # one event, not two
    assert "more kept" not in str(failed.value)
    # the probe-time message of the NVSentinel sample after an Xid 79 for the same GPU (the Xid line of the akash
    # sample, moved to bus b3): still one GPU, reported as the Xid
    xid79 = next(line for line in log.splitlines() if "Xid" in line).replace("0000:a1:00", "0000:b3:00")
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(CannedNode({("journal",): xid79 + "\n" + sample(FALLEN)}, gpu_count=8, xid_command=["journal"]))
    assert str(failed.value).startswith(FALLEN_79.replace("a1:00", "b3:00"))
    assert "more kept" not in str(failed.value)


def test_fallen_off_the_bus_is_reported_before_other_xids():
    log = sample("dmesg-xid-119.h100-xe9680.log") + sample(FALLEN)  # Xid 119 on another GPU, first in the log
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_xid(CannedNode({("journal",): log}, gpu_count=8, xid_command=["journal"]))
    assert str(failed.value).startswith(FALLEN_MESSAGE + " (and 1 more kept)" + KEPT_79), failed.value
    # it counts as Xid 79: ignored only where Xid 79 is
    ignored = {"79": "ignore"}
    node = CannedNode({("journal",): sample(FALLEN)}, gpu_count=8, xid_command=["journal"], xid_classes=ignored)
    assert hc.check_xid(node) == "no XID errors in the last 3600 s"


def test_fabric_manager_version_of_a_real_node():
    output = sample("nv-fabricmanager-version.535.161.08.txt")
    driver = re.search(r"^Driver Version\s+: (\S+)$", sample("nvidia-smi-q.h100-8gpu.535.161.08.trimmed.txt"), re.M)
    assert driver
    node = CannedNode({("nv-fabricmanager", "--version"): output}, driver=driver.group(1), gpu_count=8, nvswitch=True)
    assert hc.check_fm_version(node) == "Fabric Manager 535.161.08 matches the driver"


@pytest.mark.parametrize(
    ("name", "fields", "row"),
    [
        (
            "nvidia-smi-query-gpu.name-mem-driver-devid.csv-noheader.txt",
            ["name", "memory.total", "driver_version", "pci.device_id"],
            ["Quadro RTX 6000", "24576 MiB", "570.211.01", "0x1E3010DE"],
        ),
        (
            "nvidia-smi-query-gpu.h100-nvl.name-devid.csv-noheader.txt",
            ["name", "pci.device_id"],
            ["NVIDIA H100 NVL", "0x232110DE"],
        ),
    ],
)  # fmt: skip
def test_query_gpu_csv_of_real_nodes(name: str, fields: list[str], row: list[str]):
    argv = ("nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    rows = CannedNode({argv: sample(name)})._query(fields)
    assert rows == [dict(zip(fields, row, strict=True))] * len(sample(name).splitlines())


def test_ib_rate_of_a_real_port(tmp_path: Path):
    port = tmp_path / "mlx5_bond_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "rate").write_text(sample("sysfs-infiniband-rate.mlx5_bond_0.txt"))
    (port / "state").write_text("4: ACTIVE\n")  # the kernel's "%d: %s\n" (drivers/infiniband/core/sysfs.c)
    node = CannedNode({}, ib_sysfs_root=str(tmp_path), ib_ports=1, ib_rate_gbps=200)
    assert hc.check_ib(node) == "1 IB ports active at >= 200 Gb/s"
    node = CannedNode({}, ib_sysfs_root=str(tmp_path), ib_ports=1, ib_rate_gbps=400)
    with pytest.raises(hc.CheckFailed, match=r"mlx5_bond_0/1 at 200 Gb/s < 400"):
        hc.check_ib(node)


def chrony_csv_fields() -> list[str]:
    """`chronyc -c tracking` field names, in order, from the real human-readable `chronyc tracking` sample."""
    keys = [line.split(":", 1)[0].strip() for line in sample("chronyc-tracking.rockstor-2098.txt").splitlines()]
    return ["Reference ID", "Reference name", *keys[1:]]  # "Reference ID : 55C7D664 (85.199.214.100)" is two fields


def tracking_csv(text: str) -> str:
    """`chronyc -c tracking`'s line for a real `chronyc tracking` report.

    chronyc prints the same fields either way (client.c, process_cmd_tracking: one print_report, CSV with -c): the
    reference ID and name, stratum, reference time in seconds, then the numbers with their sign where the report
    says slow or fast, and the leap status. The checker reads the ID and name, stratum, system time and leap status.
    """
    values = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in text.splitlines())}
    refid, name = values["Reference ID"].split(" ", 1)
    ref_time = datetime.datetime.strptime(values["Ref time (UTC)"], "%a %b %d %H:%M:%S %Y")
    fields = [refid, name.strip("()"), values["Stratum"], f"{ref_time.replace(tzinfo=datetime.UTC).timestamp():.9f}"]
    for key in ("System time", "Last offset", "RMS offset", "Frequency", "Residual freq", "Skew", "Root delay",
                "Root dispersion", "Update interval"):  # fmt: skip
        number, *words = values[key].split()
        negative = ("fast" if key == "System time" else "slow") in words  # %O: slow > 0; %F: fast > 0
        fields.append(f"-{number}" if negative else number)
    return ",".join([*fields, values["Leap status"]]) + "\n"


@pytest.fixture
def chronyc(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_clock looks for chronyc on PATH before it asks the (canned) node."""
    monkeypatch.setattr(hc.shutil, "which", lambda name: f"/usr/bin/{name}")


def test_chrony_serving_its_local_clock_is_not_synchronised(chronyc: None):
    line = tracking_csv(sample("chronyc-tracking.local-stratum-10.srlinux-ntp-server.txt"))
    assert line.startswith("7F7F0101,,10,1770180461.000000000,") and line.endswith(",Normal\n")
    assert len(line.split(",")) == 14
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_clock(CannedNode({("chronyc", "-c", "tracking"): line}, clock=True))
    assert str(failed.value) == (
        "clock not synchronised to a real source: chrony is serving its local clock "
        "(reference ID 7F7F0101, stratum 10; the `local` directive, no NTP source)"
    )


def test_health_check_tests_use_the_real_local_clock_report():
    fake = load_script("health_check_tests_local", ROOT / "tests" / "integration" / "test_health_check.py").CHRONY_LOCAL
    assert fake == tracking_csv(sample("chronyc-tracking.local-stratum-10.srlinux-ntp-server.txt"))


def test_chrony_synchronised_to_a_server_passes(chronyc: None):
    line = tracking_csv(sample("chronyc-tracking.rockstor-2098.txt"))  # real, synchronised to 85.199.214.100
    assert line.startswith("55C7D664,85.199.214.100,2,") and len(line.split(",")) == 14
    message = hc.check_clock(CannedNode({("chronyc", "-c", "tracking"): line}, clock=True))
    assert message == "synchronised to 85.199.214.100 (stratum 2, offset 0.053 ms)"


def test_chrony_csv_fields_the_checker_reads():
    fields = chrony_csv_fields()
    spec = sample("chronyc-c-tracking.expected-regex.chrony-test-110.txt").strip()
    assert len(fields) == spec.count(",") + 1 == 14
    assert spec.endswith(",Normal$")
    # check_clock reads fields[0]/[1] (source), [2] (stratum), [4] (offset) and [13] (leap status)
    assert [fields[i] for i in (0, 1, 2, 4, 13)] == [
        "Reference ID", "Reference name", "Stratum", "System time", "Leap status",
    ]  # fmt: skip


# --------------------------------------------------------------------------- (b) the stand-ins look like the real tools

NVLINK_HEADER = re.compile(r"^GPU \d+: NVIDIA [^()]+ \(UUID: GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\)$")
NVLINK_SPEED = re.compile(r"^\s+Link \d+: (\d+(\.\d+)? GB/s|<inactive>)$")
NVLINK_ERRORS = re.compile(r"^\s+Link \d+: (Replay|Recovery|CRC) Errors: \d+$")
# the Xid line of drivers 535 and later, in every real kernel log sample
XID_SHAPE = re.compile(r"NVRM: Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\): \d+, pid=[^,]+, name=[^,]+, \S")
REAL_CSV = "nvidia-smi-query-gpu.name-mem-driver-devid.csv-noheader.txt"
IBSTAT = "ibstat.h100-node.cx7.txt"
REAL_LOGS = ["dmesg-xid-79.akash-support-209.log", "dmesg-xid.akash-support-244.log", "dmesg-xid-119.h100-xe9680.log"]


def line_shapes(text: str, shapes: list[re.Pattern]) -> set[str]:
    """Which of the patterns the non-empty lines match (a line matching none counts as itself)."""
    return {next((p.pattern for p in shapes if p.match(line)), line) for line in text.splitlines() if line.strip()}


def test_standin_nvlink_status_has_the_real_shape(sim: Sim):
    shapes = [NVLINK_HEADER, NVLINK_SPEED]
    real = line_shapes(sample("nvidia-smi-nvlink-s.h100-80gb-hbm3.txt"), shapes)
    assert real == line_shapes(sample("nvidia-smi-nvlink-s.a100-sxm4-80gb.txt"), shapes) == {p.pattern for p in shapes}
    assert line_shapes(sim.run("nvidia-smi", "nvlink", "-s"), shapes) == real


def test_standin_nvlink_errors_have_the_real_shape(sim: Sim):
    shapes = [NVLINK_HEADER, NVLINK_ERRORS]
    real = line_shapes(sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt"), shapes)
    assert real == {p.pattern for p in shapes}
    assert line_shapes(sim.run("nvidia-smi", "nvlink", "-e"), shapes) == real


def test_standin_nvlink_errors_separate_links(sim: Sim):
    def blank_after_crc(text: str) -> bool:
        lines = text.splitlines()
        return all(lines[i + 1] == "" for i, line in enumerate(lines[:-1]) if "CRC Errors" in line)

    assert blank_after_crc(sample("nvidia-smi-nvlink-e.h100-80gb-hbm3.txt"))
    assert blank_after_crc(sim.run("nvidia-smi", "nvlink", "-e", "-i", "0"))


def q_sections(report: str) -> dict[str, set[str]]:
    """`nvidia-smi -q` per-GPU sections (4-space keys) -> their 8-space keys; '' holds the 4-space keys themselves."""
    sections: dict[str, set[str]] = {"": set()}
    current = ""
    for line in report.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        key = line.split(":", 1)[0].strip()
        if indent == 4:
            current = key
            sections[""].add(key)
            sections.setdefault(key, set())
        elif indent == 8 and current:
            sections[current].add(key)
    return sections


REAL_Q = ["nvidia-smi-q.h100-sxm.545.23.08.txt", "nvidia-smi-q.h100-8gpu.535.161.08.trimmed.txt"]


@pytest.mark.parametrize(
    "section",
    [
        "", "Fabric", "ECC Errors", "Remapped Rows", "Retired Pages", "ECC Mode", "MIG Mode",
        "Clocks Event Reasons",
    ],
)  # fmt: skip
def test_standin_q_keys_are_real_keys(sim: Sim, section: str):
    real: set[str] = set()
    for name in [*REAL_Q, "nvidia-smi-q-fabric.grep-C3.dra-driver-626.txt"]:  # the last adds newer Fabric keys
        real |= q_sections(sample(name)).get(section, set())
    standin = q_sections(sim.run("nvidia-smi", "-q"))[section]
    assert standin, f"stand-in -q has no section {section!r}"
    assert standin <= real, f"keys not in any real sample: {sorted(standin - real)}"


def test_standin_q_gpu_headers_have_the_real_shape(sim: Sim):
    header = re.compile(r"^GPU [0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")
    real = [line for line in sample(REAL_Q[1]).splitlines() if line.startswith("GPU ")]
    standin = [line for line in sim.run("nvidia-smi", "-q").splitlines() if line.startswith("GPU ")]
    assert len(real) == len(standin) == 8
    assert all(header.match(line) for line in real + standin)


def test_standin_q_values_start_in_the_real_column(sim: Sim):
    def colons(text: str) -> set[int]:
        return {line.index(" : ") + 1 for line in text.splitlines() if " : " in line}

    assert colons(sample(REAL_Q[0])) == {42}
    assert colons(sim.run("nvidia-smi", "-q")) == {42}


def test_real_xid_lines_share_one_shape():
    for name in REAL_LOGS:
        lines = [line for line in sample(name).splitlines() if "NVRM: Xid" in line]
        assert lines and all(XID_SHAPE.search(line) for line in lines), name


def test_standin_xid_pci_address_is_lower_case(sim: Sim):
    sim.run("gpu-sim", "fault", "xid", "--gpu", "5")  # bus AB
    line = sim.run("gpu-sim", "kernel-log").strip()
    assert re.search(r"Xid \(PCI:[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\)", line), line


def test_standin_xid_line_has_the_real_shape(sim: Sim):
    sim.run("gpu-sim", "fault", "xid", "--gpu", "0")  # bus 18: digits only, so the case does not matter
    line = sim.run("gpu-sim", "kernel-log").strip()
    assert XID_SHAPE.search(line), line


def test_standin_fabric_manager_version_has_the_real_shape(sim: Sim):
    shape = re.compile(r"^Fabric Manager version is : \d+\.\d+\.\d+$")
    assert shape.match(sample("nv-fabricmanager-version.535.161.08.txt").strip())
    assert shape.match(sim.run("nv-fabricmanager", "--version").strip())


def test_standin_query_gpu_csv_has_the_real_separator(sim: Sim):
    fields = ["name", "memory.total", "driver_version"]
    real = [line.split(", ")[:3] for line in sample(REAL_CSV).splitlines()]
    out = sim.run("nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader")
    standin = [line.split(", ") for line in out.splitlines()]
    for row in real + standin:
        assert len(row) == 3
        assert re.fullmatch(r"\d+ MiB", row[1]) and re.fullmatch(r"\d+\.\d+(\.\d+)?", row[2]), row


def test_standin_ib_sysfs_has_the_real_shape(sim: Sim):
    rate = re.compile(r"^\d+ Gb/sec \(\d+X [A-Z]+\)$")
    state = re.compile(r"^\d: (NOP|DOWN|INIT|ARMED|ACTIVE|ACTIVE_DEFER)$")  # kernel ib_port_state names
    assert rate.match(sample("sysfs-infiniband-rate.mlx5_bond_0.txt"))
    ports = sorted((sim.sysfs / "class" / "infiniband").glob("*/ports/*"))
    assert all(rate.match((p / "rate").read_text().strip()) and state.match((p / "state").read_text().strip())
               for p in ports)  # fmt: skip
    # the real H100 node: eight 400 Gb/s InfiniBand ports (plus an Ethernet bond, which the checker skips)
    blocks = [dict(re.findall(r"^\s+([^:\n]+): (.*)$", block, re.M)) for block in sample(IBSTAT).split("CA '")[1:]]
    real = [b["Rate"] for b in blocks if b["Link layer"] == "InfiniBand" and b["State"] == "Active"]
    assert real == ["400"] * 8 == [(p / "rate").read_text().split()[0] for p in ports]


def test_standin_chronyc_csv_has_the_real_fields():
    fake = (
        load_script("health_check_tests", ROOT / "tests" / "integration" / "test_health_check.py")
        .CHRONY_SYNCED.strip()
        .split(",")
    )
    assert len(fake) == len(chrony_csv_fields()) == 14
    assert re.fullmatch(r"[0-9A-F]{8}", fake[0]) and fake[2].isdigit()
    assert all(re.fullmatch(r"[+-]?\d+\.\d+", value) for value in fake[3:13]), fake
    assert fake[13] in ("Normal", "Insert second", "Delete second", "Not synchronised")


def box_widths(text: str) -> set[int]:
    return {len(line.rstrip()) for line in text.splitlines() if line.startswith(("|", "+"))}


def test_standin_dcgmi_discovery_has_the_real_table(sim: Sim, engine: str):
    real = sample("dcgmi-discovery-l.h100-sxm.dcgm-229.txt")
    out = sim.run("dcgmi", "discovery", "-l", "--host", engine)
    assert re.match(r"^\d+ GPUs found\.$", real.splitlines()[0]) and re.match(
        r"^\d+ GPUs found\.$", out.splitlines()[0]
    )
    assert box_widths(real) == {81}
    gpu_table = out.split("NvSwitch")[0]
    assert box_widths(gpu_table) == {81}


def test_standin_dcgmi_diag_has_the_real_table(sim: Sim, engine: str):
    def rows(text: str) -> set[str]:
        return {m.group(1).strip() for m in re.finditer(r"^\| ([^|]+?)\s+\| ", text, re.M)}

    metadata = {"DCGM Version", "Driver Version Detected", "GPU Device IDs Detected"}
    for name in ("dcgmi-diag-r3.h100-8gpu.fabric-not-ready.txt", "dcgmi-diag-r3.h200-8gpu.pass.txt"):
        assert box_widths(sample(name)) == {78} and metadata <= rows(sample(name))
    out = sim.run("dcgmi", "diag", "-r", "1", "--host", engine)
    assert out.splitlines()[0] == "Successfully ran diagnostic for group."
    assert box_widths(out) == {78}
    assert {"DCGM Version", "Driver Version Detected"} <= rows(out) <= rows(sample("dcgmi-diag-r3.h200-8gpu.pass.txt"))


# --------------------------------------------------------------------------- dcgmi health -c (issue 47)

HEALTH_WARNING = "dcgmi-health-c.power-warning.l4.dcgm-461.txt"
HEALTH_HEALTHY = "dcgmi-health-c.healthy.gb200.dcgm-452.txt"
POWER_WARNING = (
    "Detected clocks event due to power violation in GPU 0. Monitor the power conditions. This GPU can still perform"
    " workload."
)


def test_dcgmi_health_tables_are_read_with_gpu_system_severity_and_the_whole_message():
    assert hc.health_incidents(sample(HEALTH_HEALTHY)) == ("Healthy", [])
    incident = ("GPU 0", "Power system", "Warning", POWER_WARNING)
    assert hc.health_incidents(sample(HEALTH_WARNING)) == ("Warning", [incident])
    watched = ("dcgmi", "health", "-c")
    assert hc.check_dcgm_health(CannedNode({watched: sample(HEALTH_HEALTHY)}, gpu_count=1)) == (
        "DCGM health watches: healthy"
    )
    said = hc.check_dcgm_health(CannedNode({watched: sample(HEALTH_WARNING)}, gpu_count=1))
    assert said == f"warning: DCGM health: GPU 0 Power system: Warning: {POWER_WARNING}"  # said, not drained
    # a Failure the same way (DCGM's own words for a double-bit error) fails the node, naming GPU and system
    failure = sample(HEALTH_WARNING).replace("Warning ", "Failure ").replace("Power system", "Memory system")
    with pytest.raises(hc.CheckFailed, match=r"^DCGM health: GPU 0 Memory system: Failure: Detected clocks"):
        hc.check_dcgm_health(CannedNode({watched: failure}, gpu_count=1))


def test_standin_dcgmi_health_has_the_real_table(sim: Sim, engine: str):
    assert box_widths(sample(HEALTH_WARNING)) == box_widths(sample(HEALTH_HEALTHY)) == {88}
    # no watch set: DCGM's own error (NVIDIA/DCGM#176)
    unset = sim.run("dcgmi", "health", "-c", "--host", engine, check=1)
    assert unset.startswith("Error: Health watches not enabled. Please enable watches.")
    assert sim.run("dcgmi", "health", "-s", "a", "--host", engine) == "Health monitor systems set successfully.\n"
    assert sim.run("dcgmi", "health", "-c", "--host", engine) == sample(HEALTH_HEALTHY)
    sim.run("gpu-sim", "fault", "dcgm-pcie-replay", "--gpu", "3")
    out = sim.run("dcgmi", "health", "-c", "--host", engine)
    assert box_widths(out) == {88}
    overall, [incident] = hc.health_incidents(out)
    assert (overall, incident[:3]) == ("Warning", ("GPU 3", "PCIe system", "Warning"))
    assert incident[3].startswith("Detected more than 8 PCIe replays per minute for GPU 3 : 13 Reconnect PCIe card.")


# --------------------------------------------------------------------------- nvidia-smi -q: PCIe link, HBM (issue 33)

Q_H100 = "nvidia-smi-q.h100-sxm.545.23.08.txt"


def test_nvidia_smi_q_is_read_per_gpu_by_section_path():
    [gpu] = hc.q_gpus(sample(Q_H100))
    assert gpu["GPU"] == "00000000:19:00.0" and gpu["Minor Number"] == "0"
    assert {k.removeprefix("PCI/GPU Link Info/"): v for k, v in gpu.items() if k.startswith("PCI/GPU Link Info/")} == {
        "PCIe Generation/Max": "5",
        "PCIe Generation/Current": "5",
        "PCIe Generation/Device Current": "5",
        "PCIe Generation/Device Max": "5",
        "PCIe Generation/Host Max": "5",
        "Link Width/Max": "16x",
        "Link Width/Current": "16x",
    }
    assert gpu["PCI/Replays Since Reset"] == "0"
    assert gpu["Clocks Event Reasons/Idle"] == "Active"
    assert gpu["Temperature/Memory Current Temp"] == "41 C"
    assert gpu["Temperature/GPU Current Temp"] == "33 C"
    # eight GPUs of the 535 report, each its own section
    assert len(hc.q_gpus(sample("nvidia-smi-q.h100-8gpu.535.161.08.trimmed.txt"))) == 8


def test_pcie_judges_only_busy_gpus():
    q = sample(Q_H100)
    idle = CannedNode({("nvidia-smi", "-q"): q}, gpu_count=1)
    assert hc.check_pcie(idle) == (
        "0 busy GPUs at their maximum PCIe link, replays <= 100; 1 idle GPUs not judged (an idle GPU lowers its link)"
    )
    # the same report with the GPU busy (its Idle reason not active) and its link trained at x8 and Gen3
    busy = q.replace(
        "        Idle                              : Active", "        Idle                              : Not Active"
    )
    assert busy != q
    full = CannedNode({("nvidia-smi", "-q"): busy}, gpu_count=1)
    assert hc.check_pcie(full) == "1 busy GPUs at their maximum PCIe link, replays <= 100"
    narrow = busy.replace(
        "                Current                   : 16x", "                Current                   : 8x"
    )
    slow = narrow.replace(
        "                Current                   : 5\n", "                Current                   : 3\n", 1
    )
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_pcie(CannedNode({("nvidia-smi", "-q"): slow}, gpu_count=1))
    assert str(failed.value) == "GPU 0 PCIe x8 of x16 while busy; GPU 0 PCIe Gen3 of Gen5 while busy"
    replays = q.replace(
        "        Replays Since Reset               : 0", "        Replays Since Reset               : 101"
    )
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_pcie(CannedNode({("nvidia-smi", "-q"): replays}, gpu_count=1))
    assert str(failed.value) == "GPU 0 101 PCIe replays (max 100)"


def test_gpus_are_named_by_their_index_not_their_minor_number():
    """Issue 47: on a real 8-GPU host the index (nvidia-smi's table, --query-gpu, CUDA_VISIBLE_DEVICES) is the bus
    order, while -q's Minor Number (/dev/nvidia<N>) runs otherwise: index 0 at 01:00.0 is minor 3, index 3 at
    61:00.0 is minor 0. Messages built from -q name the index."""
    q = sample("nvidia-smi-q.rtx4090-8gpu.550.127.05.trimmed.txt")
    rows = re.findall(
        r"^\|\s+(\d+)\s+NVIDIA.*?\|\s+(\S+) ", sample("nvidia-smi.rtx4090-8gpu.550.127.05.gpu-rows.txt"), re.M
    )
    query = "\n".join(
        f"{index}, {bus}" for index, bus in rows
    )  # the table's index and bus id, as --query-gpu says them
    assert [gpu["Minor Number"] for gpu in hc.q_gpus(q)] == ["3", "2", "1", "0", "7", "6", "5", "4"]
    # GPU index 0 (minor 3) replayed too often; GPU index 3 (minor 0) busy at Gen1 of Gen4
    sections = q.split("GPU 00000000:")
    sections[1] = sections[1].replace(
        "Replays Since Reset               : 0", "Replays Since Reset               : 101"
    )
    sections[4] = sections[4].replace(
        "Idle                              : Active", "Idle                              : Not Active"
    )
    canned = {
        ("nvidia-smi", "-q"): "GPU 00000000:".join(sections),
        ("nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader,nounits"): query,
    }
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_pcie(CannedNode(canned, gpu_count=8))
    assert str(failed.value) == "GPU 0 101 PCIe replays (max 100); GPU 3 PCIe Gen1 of Gen4 while busy"


# --------------------------------------------------------------------------- EDAC, AER, IB counters (issue 33)


def sysfs_from_listing(text: str, root: Path) -> Path:
    """A sysfs tree under ``root`` from a real listing: "path" then "value" lines (find ... cat), or
    "path:value" lines (grep .)."""
    lines = text.splitlines()
    pairs = (
        [tuple(line.rsplit(":", 1)) for line in lines]
        if all(":" in line for line in lines)
        else list(zip(lines[::2], lines[1::2], strict=True))
    )
    for path, value in pairs:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value.strip() + "\n")
    return root


def test_edac_counters_of_a_real_server(tmp_path: Path):
    tree = sysfs_from_listing(sample("edac-find-cat-ce-ue-netdata-serverB.txt"), tmp_path)
    root = tree / "sys" / "devices" / "system" / "edac" / "mc"
    assert hc.edac_counts(root) == {"mc0": (0, 0)}  # one controller, four csrows (their counts: the rows')
    node = CannedNode({("journal",): ""}, edac_sysfs_root=str(root), xid_command=["journal"])
    assert hc.check_edac(node) == (
        "no uncorrectable memory errors on 1 memory controllers (0 corrected), none logged in the last 3600 s"
    )
    (root / "mc0" / "ue_count").write_text("2\n")  # the same tree with two uncorrectable errors
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_edac(node)
    assert str(failed.value).startswith("mc0: 2 uncorrectable memory errors (max 0) [kept since ")


@pytest.mark.parametrize(
    ("name", "errors"),
    [
        # Intel skx/i10nm (an injected error), then a production UE followed by a CE storm whose console lines break
        # mid-word, then AMD's amd64_edac, whose UE names no kind of error and which the UMC calls "Deferred"
        (
            "dmesg-edac-ue-skx-einj.lkml-2021-08-12.txt",
            [("mc3", 1, "memory read error", "CPU_SrcID#0_MC#3_Chan#0_DIMM#0")],
        ),
        (
            "dmesg-edac-ue-then-ce-storm.lkml-2023-08-28.txt",
            [("mc0", 1, "memory read error", "CPU_SrcID#0_MC#0_Chan#1_DIMM#0")],
        ),
        ("dmesg-edac-ue-amd64-zen.k8s-homelab.txt", [("mc0", 1, "memory error", "mc#0csrow#0channel#0")]),
    ],
)
def test_uncorrectable_memory_errors_of_real_kernel_logs(name: str, errors: list[tuple[str, int, str, str]]):
    assert hc.logged_ue(sample(name)) == errors


def test_standin_edac_ue_line_has_the_real_shape():
    """The stand-in's UE line (gpu-sim fault edac-ue-logged) is the real skx line's, numbers aside, cut short."""
    real = next(line for line in sample("dmesg-edac-ue-skx-einj.lkml-2021-08-12.txt").splitlines() if " UE " in line)
    real = real.split("] ", 1)[1]  # dmesg's time stamp: journalctl -k -o cat prints none

    def shape(text: str) -> str:
        return re.sub(r"0x[0-9a-f]+|\d+", "N", text)

    standin = load_script("gpu_sim", STANDIN / "gpusim" / "gpu_sim.py").EDAC_UE_LINE
    assert shape(real).startswith(shape(standin).removesuffix(")"))
    assert hc.logged_ue(standin) == [("mc1", 1, "memory read error", "CPU_SrcID#0_MC#1_Chan#0_DIMM#0")]


def test_an_uncorrectable_memory_error_that_crashed_the_node_is_found_in_the_kernel_log(tmp_path: Path):
    """Issue 47: after the reboot EDAC's counters are 0 again (the real server's listing), and only the persistent
    kernel log (journalctl -k reads the boots before this one too) still holds the error: it fails the node, kept,
    naming the DIMM, and the same error logged twice (the capture's two signals) is one record."""
    tree = sysfs_from_listing(sample("edac-find-cat-ce-ue-netdata-serverB.txt"), tmp_path)
    root = tree / "sys" / "devices" / "system" / "edac" / "mc"
    log = sample("dmesg-edac-ue-skx-einj.lkml-2021-08-12.txt")
    ue_line = next(line for line in log.splitlines() if " UE " in line)
    node = CannedNode({("journal",): log + ue_line + "\n"}, edac_sysfs_root=str(root), xid_command=["journal"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_edac(node)
    assert str(failed.value).startswith(
        "mc3: 1 uncorrectable memory read error logged by the kernel on CPU_SrcID#0_MC#3_Chan#0_DIMM#0 [kept since "
    )
    assert [r["key"] for r in hc.read_sticky(node.config)["records"]] == ["edac log mc3 CPU_SrcID#0_MC#3_Chan#0_DIMM#0"]
    # corrected errors only (the storm's CE lines without its UE): nothing to judge
    storm = "\n".join(line for line in sample("dmesg-edac-ue-then-ce-storm.lkml-2023-08-28.txt").splitlines()
                      if " UE " not in line)  # fmt: skip
    calm = CannedNode({("journal",): storm}, edac_sysfs_root=str(root), xid_command=["journal"])
    assert hc.check_edac(calm).endswith("(0 corrected), none logged in the last 3600 s")


def test_the_dimm_that_holds_an_uncorrectable_error_is_named(tmp_path: Path):
    """Per-DIMM counters (a real AMD host's rank directories, each labelled by the platform): the controller's count
    fails the node and the message names the DIMM whose own count holds it (the test writes the counts)."""
    root = sysfs_from_listing(sample("edac-grep-r-rank-dirs.amd-f17h.lkml-2021-11-11.txt"), tmp_path)
    mc = root / "sys" / "devices" / "system" / "edac" / "mc"
    (mc / "mc0" / "ue_count").write_text("1\n")
    assert hc.dimm_counts(mc) == {"mc0": [("mc#0csrow#2channel#1", 0, 0), ("mc#0csrow#3channel#1", 0, 0)]}
    (mc / "mc0" / "rank7" / "dimm_ue_count").write_text("1\n")
    node = CannedNode({("journal",): ""}, edac_sysfs_root=str(mc), xid_command=["journal"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_edac(node)
    assert str(failed.value).startswith("mc0: 1 uncorrectable memory errors (max 0) on mc#0csrow#3channel#1 (1) [kept")


@pytest.mark.parametrize(
    ("name", "errors"),
    [
        ("dmesg-aer-fatal-surprise-down-tesla-xid79.txt", [("0000:00:02.0", "Fatal", "Surprise Down Error")]),
        ("dmesg-aer-multiple-fatal-broadwell-nvidia-returnn.txt", [("0000:00:03.0", "Fatal", "SDES")]),
        ("dmesg-aer-fatal-malformed-tlp-rocm.txt", [("0000:00:1c.4", "Fatal", "Malformed TLP")]),
        ("dmesg-aer-uncorrectable-nonfatal-acsviol-journal-pve.txt", [("0000:80:1b.4", "Non-Fatal", "ACSViol")]),
    ],
)
def test_uncorrectable_pcie_errors_of_real_kernel_logs(name: str, errors: list[tuple[str, str, str]]):
    assert hc.aer_errors(sample(name)) == errors


def test_a_fatal_pcie_error_fails_and_a_non_fatal_one_is_reported():
    fatal = CannedNode({("journal",): sample("dmesg-aer-fatal-surprise-down-tesla-xid79.txt")}, xid_command=["journal"])
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_aer(fatal)
    assert str(failed.value).startswith("fatal PCIe error at 0000:00:02.0 (Surprise Down Error) [kept since ")
    log = sample("dmesg-aer-uncorrectable-nonfatal-acsviol-journal-pve.txt")
    assert hc.check_aer(CannedNode({("journal",): log}, xid_command=["journal"])) == (
        "warning: non-fatal uncorrectable PCIe errors: 0000:80:1b.4 (ACSViol) (last 3600 s)"
    )


def test_ib_counters_of_a_real_h100_port(tmp_path: Path):
    """A ConnectX-7 port of an H100 node (the listing's "=== ./name ===" then value), as the check reads it."""
    counters = tmp_path / "mlx5_1" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    text = sample("ib-counters-mlx5_1-cx7-gpud-pr943.txt")
    for name, value in re.findall(r"^=== \./(\S+) ===\n(\S+)$", text, flags=re.M):
        (counters / name).write_text(value + "\n")
    names = ["symbol_error", "link_downed", "link_error_recovery", "excessive_buffer_overrun_errors"]
    assert hc.ib_counters(tmp_path, names) == {
        "mlx5_1/1": {
            "symbol_error": 0,
            "link_downed": 255,
            "link_error_recovery": 0,
            "excessive_buffer_overrun_errors": 15,
        }
    }


def real_port(root: Path, **values: int) -> Path:
    """/sys/class/infiniband of one InfiniBand port whose counters are the real ConnectX-7 capture's, some changed."""
    port = root / "mlx5_1" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "link_layer").write_text("InfiniBand\n")
    text = sample("ib-counters-mlx5_1-cx7-gpud-pr943.txt")
    for name, value in {**dict(re.findall(r"^=== \./(\S+) ===\n(\S+)$", text, flags=re.M)), **values}.items():
        (port / "counters" / name).write_text(f"{value}\n")
    return root


def test_a_real_port_whose_link_downed_counter_is_at_its_maximum_fails(tmp_path: Path):
    """Issue 47: the real port's link_downed is 255, its 8-bit maximum (IBA PortCounters): it can never rise again,
    so a check that looks only for increases would pass it forever. It fails, kept; its other saturated counters,
    excessive_buffer_overrun_errors (15, 4 bits) and port_xmit_discards (65535, 16 bits), are warnings."""
    node = CannedNode({}, ib_sysfs_root=str(real_port(tmp_path / "sys")), ib_ports=1)
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_ib_errors(node)
    assert str(failed.value).startswith(
        "mlx5_1/1 link_downed at its maximum 255: its link flaps can no longer be counted (reset the port's counters "
        "with perfquery -R once the cause is found) [kept since "
    )
    reset = CannedNode({}, ib_sysfs_root=str(real_port(tmp_path / "reset", link_downed=0)), ib_ports=1)
    assert hc.check_ib_errors(reset) == (
        "warning: mlx5_1/1 excessive_buffer_overrun_errors at its maximum 15; mlx5_1/1 port_xmit_discards at its "
        "maximum 65535 (reset the port's counters with perfquery -R once the cause is found); 1 IB ports' error "
        "counters read (first run: nothing to compare)"
    )


def test_transmit_discards_are_judged_against_their_own_limit(tmp_path: Path):
    """port_xmit_discards (reset here: the real port's is at its maximum) may grow by ib_xmit_discards_increase_max
    between runs: a busy fabric discards some; more is kept like any counter's jump."""
    root = real_port(tmp_path / "sys", link_downed=0, excessive_buffer_overrun_errors=0, port_xmit_discards=0)
    node = CannedNode({}, ib_sysfs_root=str(root), ib_ports=1, ib_xmit_discards_increase_max=100)
    assert hc.check_ib_errors(node).startswith("1 IB ports' error counters read (first run")
    discards = root / "mlx5_1" / "ports" / "1" / "counters" / "port_xmit_discards"
    discards.write_text("100\n")  # at the limit: still fine
    assert hc.check_ib_errors(node).startswith("no IB error counter jumped")
    discards.write_text("250\n")
    with pytest.raises(hc.CheckFailed) as failed:
        hc.check_ib_errors(node)
    assert re.match(r"mlx5_1/1 port_xmit_discards \+150 since \S+ \(max 100\) \[kept since ", str(failed.value))


def nvme_tree(root: Path, drives: int) -> Path:
    """/sys/class/nvme of a host with ``drives`` live PCIe NVMe controllers (the kernel's file names)."""
    for n in range(drives):
        (root / f"nvme{n}").mkdir(parents=True)
        (root / f"nvme{n}" / "state").write_text("live\n")
        (root / f"nvme{n}" / "transport").write_text("pcie\n")
    return root


SMART = ("nvme", "smart-log", "{device}", "--output-format=json")


@pytest.mark.parametrize(
    ("name", "worn"),
    [("nvme-smart-log-json.v2.11.netdata-fixture.json", 30), ("nvme-smart-log-json.pre-v2.11.netdata-fixture.json", 2)],
)
def test_nvme_smart_logs_of_both_nvme_cli_formats(tmp_path: Path, name: str, worn: int):
    log = sample(name)
    outputs = {tuple(a.replace("{device}", f"/dev/nvme{n}") for a in SMART): log for n in range(10)}
    node = CannedNode(outputs, nvme_count=10, nvme_sysfs_root=str(nvme_tree(tmp_path, 10)), nvme_smart_command=SMART)
    assert hc.check_nvme(node) == (
        f"10 NVMe drives live, no SMART critical warning; most worn: nvme9 at {worn}% of its rated endurance"
    )
    # the same log with the critical warning of a real failed drive (0x9: spare below its threshold, read-only)
    failed = json.loads(log)
    if isinstance(failed["critical_warning"], dict):
        failed["critical_warning"].update(value=9, available_spare=1, ro=1)
    else:
        failed["critical_warning"] = 9
    outputs[("nvme", "smart-log", "/dev/nvme4", "--output-format=json")] = json.dumps(failed)
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nvme(CannedNode(outputs, nvme_count=10, nvme_sysfs_root=str(tmp_path), nvme_smart_command=SMART))
    assert str(raised.value) == "nvme4 SMART critical warning 0x09: spare capacity below its threshold, read-only"


def test_a_missing_or_dead_nvme_drive_fails_and_fabric_controllers_are_not_counted(tmp_path: Path):
    root = nvme_tree(tmp_path, 9)
    (root / "nvme3" / "state").write_text("dead\n")
    (root / "nvme9").mkdir()  # an NVMe over Fabrics controller: not one of this node's drives
    (root / "nvme9" / "transport").write_text("tcp\n")
    node = CannedNode({}, nvme_count=10, nvme_sysfs_root=str(root), nvme_smart_command=[])
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nvme(node)
    assert str(raised.value) == ("9 of 10 NVMe drives present: nvme[0-8]; nvme3 dead")
    (root / "nvme3" / "state").write_text("live\n")
    node = CannedNode({}, nvme_count=9, nvme_sysfs_root=str(root), nvme_smart_command=[])
    assert hc.check_nvme(node) == "9 NVMe drives live (SMART not read: nvme_smart_command empty)"
    node = CannedNode({}, nvme_count=9, nvme_sysfs_root=str(root), nvme_smart_command=["nvme", "smart-log", "{device}"])
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nvme(node)
    assert str(raised.value).startswith("nvme0 SMART log unreadable (rc 2: not canned: ('nvme', 'smart-log', ")


NCCL = ["sh", "all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"]  # sh: a command on PATH


def nccl_node(output: str, minimum: int) -> object:
    argv = tuple(part.replace("{gpus}", "8") for part in NCCL)
    return CannedNode({argv: output}, gpu_count=8, nccl_command=NCCL, nccl_busbw_min_gbps=minimum)


def test_nccl_judges_the_largest_message_of_real_all_reduce_runs():
    """The sweep's average moves with its sizes: a real 8x H100 run averages 439 GB/s over 128 MiB-4 GiB and
    holds 473.6 GB/s at 4 GiB; two nodes over NDR (srun's labels on every line) hold 155.6 GB/s at 8 GiB."""
    one = sample("all_reduce_perf.8xh100.nccl-tests-290.txt")
    assert hc.largest_message_busbw(one) == (4 * 2**30, 473.6)
    assert hc.check_nccl(nccl_node(one, 450)) == "bus bandwidth 473.6 GB/s at 4 GiB (expected >= 450 GB/s)"
    two = sample("all_reduce_perf.16xh100-2node-ndr.srun-label.nccl-tests-290.txt")
    assert hc.largest_message_busbw(two) == (8 * 2**30, 155.57)
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nccl(nccl_node(two, 450))
    assert str(raised.value) == "bus bandwidth 155.6 GB/s at 8 GiB < expected 450 GB/s"
    # 0: reported, not judged; only an average line: that is what is judged
    assert hc.check_nccl(nccl_node(two, 0)) == "bus bandwidth 155.6 GB/s at 8 GiB"
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nccl(nccl_node("# Avg bus bandwidth    : 201.5\n", 450))
    assert str(raised.value) == "bus bandwidth 201.5 GB/s (average) < expected 450 GB/s"


def test_nccl_runs_only_when_named_and_a_missing_tool_is_skipped():
    config = json.loads(json.dumps({key: default for key, (_kind, default) in hc.SETTINGS.items()}))
    config.update(gpu_count=8, nccl_command=["/nonexistent/all_reduce_perf", "-g", "{gpus}"])
    assert "nccl" not in [r["name"] for r in hc.run_checks(config, None)]  # Slurm's periodic program: never
    [result] = hc.run_checks(config, ["nccl"])
    assert (result["status"], result["message"]) == (
        "skip",
        "nccl-tests' all_reduce_perf is not installed (/nonexistent/all_reduce_perf not found)",
    )
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nccl(nccl_node("srun: error: Unable to allocate resources\n", 450))
    assert str(raised.value) == "all_reduce_perf failed (rc 0): srun: error: Unable to allocate resources"


def test_a_command_stopped_by_a_signal_interrupts_the_check_instead_of_failing_it():
    """A validation job preempted by a user's job: its diagnostic is killed, which says nothing about the node."""
    with pytest.raises(hc.Interrupted):
        hc.run(["sh", "-c", "kill -TERM $$"], timeout=10)
    assert hc.run(["sh", "-c", "exit 3"], timeout=10).rc == 3


def free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def test_standin_all_reduce_across_two_nodes_reports_the_slower_one(tmp_path: Path):
    """Two ranks of the stand-in all_reduce_perf (as srun starts them, one per node) meet over TCP; rank 0 alone
    prints the report, for the slower node's peak bounded by the fabric; the checker reads it as it reads the
    real tool's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fast, slow = Sim(tmp_path / "a"), Sim(tmp_path / "b")
    slow.run("gpu-sim", "fault", "nccl-slow")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "scontrol").write_text("#!/bin/sh\necho localhost\n")  # `scontrol show hostnames` of the step
    (tools / "scontrol").chmod(0o755)
    job = next(str(port - 20000) for port in range(30000, 40000) if free(port))  # it listens on 20000 + job % 20000
    argv = [sys.executable, str(STANDIN / "nccltests" / "all_reduce_perf.py"), "-b", "1G", "-e", "8G", "-g", "8"]
    slurm = {"SLURM_NTASKS": "2", "SLURM_JOB_ID": job, "SLURM_STEP_NODELIST": "localhost"}
    ranks = [
        subprocess.Popen(
            argv,
            env={**sim.env, **slurm, "SLURM_PROCID": str(rank), "PATH": f"{tools}:{os.environ['PATH']}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, sim in ((1, slow), (0, fast))
    ]
    (out0, err0), (out1, err1) = (ranks[1].communicate(timeout=60), ranks[0].communicate(timeout=60))
    assert (ranks[1].returncode, ranks[0].returncode) == (0, 0), (err0, err1)
    assert out1 == ""  # rank 1 prints nothing
    assert hc.largest_message_busbw(out0) == (8 * 2**30, 117.58)


def test_nccl_pair_runs_inside_a_two_node_job_and_judges_the_pairs_run(monkeypatch: pytest.MonkeyPatch):
    pair = ["sh", "srun", "all_reduce_perf", "-g", "{gpus}"]
    two = sample("all_reduce_perf.16xh100-2node-ndr.srun-label.nccl-tests-290.txt")
    node = CannedNode({("sh", "srun", "all_reduce_perf", "-g", "8"): two}, gpu_count=8, nccl_pair_command=pair,
                      nccl_pair_busbw_min_gbps=360)  # fmt: skip
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    with pytest.raises(hc.Skip) as skipped:
        hc.check_nccl_pair(node)
    assert str(skipped.value) == "runs inside a Slurm job of two nodes (this one: no job)"
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_nccl_pair(node)
    assert str(raised.value) == "bus bandwidth 155.6 GB/s at 8 GiB < expected 360 GB/s"


def test_ib_write_bw_reads_the_real_ndr_report():
    """A real NDR port: 392.34 Gb/s average at 64 KiB, with perftest's CPU frequency warning inside the table."""
    assert hc.write_bw(sample("ib_write_bw.ndr-ib.mlx5_0.report-gbits.txt")) == (65536, 392.34)
    assert hc.write_bw("Couldn't connect to dgx02:18515\n") is None


def test_standin_ib_write_bw_prints_the_real_table(tmp_path: Path):
    """The stand-in's header row is the real tool's, and its report reads as the real one does."""
    (tmp_path / "a").mkdir()
    a = Sim(tmp_path / "a")
    port = next(p for p in range(30000, 40000) if free(p))
    tool = [sys.executable, str(STANDIN / "perftest" / "ib_write_bw.py"), "-d", "mlx5_2", "-p", str(port)]
    server = subprocess.Popen([*tool, "--report_gbits"], env=a.env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while free(port):
        assert server.poll() is None and time.monotonic() < deadline, "the stand-in server did not listen"
        time.sleep(0.05)
    argv = [*tool, "--report_gbits", "localhost"]
    client = subprocess.run(argv, env=a.env, capture_output=True, text=True, check=False)
    served, _ = server.communicate(timeout=30)
    real = sample("ib_write_bw.ndr-ib.mlx5_0.report-gbits.txt").splitlines()
    header = next(line for line in real if line.startswith(" #bytes"))
    for out in (client.stdout, served):
        assert header in out.splitlines(), out
        assert hc.write_bw(out) == (65536, 392.4), out
    refused = subprocess.run([*tool, "localhost"], env=a.env, capture_output=True, text=True, check=False)
    assert (refused.returncode, refused.stdout.splitlines()[0]) == (1, f"Couldn't connect to localhost:{port}")


def test_ib_pair_writes_to_each_port_from_the_other_node_and_names_a_slow_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """This node (sim a) serves on each ACTIVE port; the job's other node (sim b, its client started through the
    launcher) writes to it. b's mlx5_3 carries a quarter of its rate: the check fails naming that port."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Sim(tmp_path / "a"), Sim(tmp_path / "b")
    b.run("gpu-sim", "fault", "ib-slow", "--device", "mlx5_3")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "scontrol").write_text("#!/bin/sh\necho localhost; echo dgx02\n")  # `scontrol show hostnames`
    (tools / "scontrol").chmod(0o755)
    partner = [f"{key}={b.env[key]}" for key in ("GPU_SIM_STATE", "GPU_SIM_LIB", "GPU_SIM_RUN", "GPU_SIM_SYSFS")]
    for key in ("GPU_SIM_STATE", "GPU_SIM_LIB", "GPU_SIM_RUN", "GPU_SIM_SYSFS"):
        monkeypatch.setenv(key, a.env[key])
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURMD_NODENAME", "localhost")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost,dgx02")
    config = json.loads(json.dumps({key: default for key, (_kind, default) in hc.SETTINGS.items()}))
    config.update(
        ib_ports=8,
        ib_sysfs_root=str(a.sysfs / "class" / "infiniband"),
        ib_pair_command=[sys.executable, str(STANDIN / "perftest" / "ib_write_bw.py"), "--report_gbits"],
        ib_pair_launcher=["env", *partner],  # {partner} unused: the "other node" is this host with b's ports
        ib_write_bw_min_gbps=380,
    )
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    with pytest.raises(hc.Skip):
        hc.check_ib_pair(hc.Node(config))
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    with pytest.raises(hc.CheckFailed) as raised:
        hc.check_ib_pair(hc.Node(config))
    assert str(raised.value) == "ib_write_bw from dgx02: mlx5_3 98.1 Gb/s < expected 380 Gb/s"
    b.run("gpu-sim", "clear", "ib-slow")
    assert hc.check_ib_pair(hc.Node(config)) == (
        "ib_write_bw from dgx02 on 8 ports: lowest 392.4 Gb/s (mlx5_0) (expected >= 380 Gb/s)"
    )
    # a port this node cannot serve on (DOWN here) is not tested: the ib check fails it; the others are
    a.run("gpu-sim", "fault", "ib-down", "--device", "mlx5_5")
    assert hc.check_ib_pair(hc.Node(config)).startswith("ib_write_bw from dgx02 on 7 ports: ")

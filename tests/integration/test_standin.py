"""The stand-in kit (tests/standin): simulated GPUs, NVIDIA tool stand-ins, packages and the signed apt repo.

Host-only and fast: no containers. Tools run straight from the source tree with GPU_SIM_* pointing into tmp_path.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import STANDIN
from corectl.errors import CorectlError
from corectl.lab.docker import engine_ready
from corectl.lab.image import ensure_image

TOOLS = {
    "gpu-sim": "gpusim/gpu_sim.py",
    "nvidia-smi": "driver/nvidia_smi.py",
    "nvidia-persistenced": "driver/nvidia_persistenced.py",
    "nv-fabricmanager": "fabricmanager/nv_fabricmanager.py",
    "nv-hostengine": "dcgm/nv_hostengine.py",
    "dcgmi": "dcgm/dcgmi.py",
    "dcgm-exporter": "dcgm-exporter/dcgm_exporter.py",
}
BUILD_TOOLS = ("dpkg-deb", "gpg", "gpgconf")
needs_build_tools = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in BUILD_TOOLS), reason="dpkg-deb and gpg are needed to build the repo"
)


def wait_for(check: Callable[[], object], timeout: float = 10.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()  # an answer begun before the deadline never ends the wait
        result = check()
        if result:
            return result
        if asked > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- simulated node


class Node:
    """One simulated GPU node in tmp_path: env for the tools, version files, background daemons."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lib = root / "lib"
        self.lib.mkdir()
        self.env = dict(
            os.environ,
            GPU_SIM_STATE=str(root / "etc" / "gpus.json"),
            GPU_SIM_LIB=str(self.lib),
            GPU_SIM_RUN=str(root / "run"),
            GPU_SIM_SYSFS=str(root / "sysfs"),
            GPU_SIM_DEV=str(root / "dev"),
            GPU_SIM_POWER_ON=str(root / "power-on"),
            GPU_SIM_MODULES=str(root / "modules"),
            GPU_SIM_MODULES_LOAD_D=str(root / "modules-load.d"),
            GPU_SIM_JOURNAL=str(root / "journal.socket"),  # none there: this machine's own journal is left alone
            PYTHONDONTWRITEBYTECODE="1",
        )
        self.procs: list[subprocess.Popen] = []

    def install(self, driver: str | None = None, fm: str | None = None, dcgm: str | None = None) -> None:
        for name, version in (("driver-version", driver), ("fm-version", fm), ("dcgm-version", dcgm)):
            if version is not None:
                (self.lib / name).write_text(version + "\n")

    def run(self, tool: str, *args: str, check: int | None = 0) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, str(STANDIN / TOOLS[tool]), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check is not None:
            assert result.returncode == check, f"{tool} {args}: rc={result.returncode}\n{result.stdout}{result.stderr}"
        return result

    def start(self, tool: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, str(STANDIN / TOOLS[tool]), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=10)

    def state(self) -> dict:
        return json.loads(Path(self.env["GPU_SIM_STATE"]).read_text())

    def query(self, fields: str, fmt: str = "csv,noheader,nounits") -> list[list[str]]:
        out = self.run("nvidia-smi", f"--query-gpu={fields}", f"--format={fmt}").stdout
        return [line.split(", ") for line in out.splitlines()]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    sim = Node(tmp_path)
    sim.install(driver="580.95.05", fm="580.95.05", dcgm="4.2.3")
    sim.run("gpu-sim", "init", "--hostname", "dgx01")
    try:
        yield sim
    finally:
        sim.close()


def test_init_describes_eight_h100s(node: Node):
    state = node.state()
    assert state["hostname"] == "dgx01"
    assert state["loaded_driver"] == "580.95.05"
    assert [g["pci_bus_id"][9:11] for g in state["gpus"]] == ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    assert all(len(g["nvlinks"]) == 18 for g in state["gpus"])
    assert len({g["uuid"] for g in state["gpus"]}) == 8
    # init again is a no-op; --force recreates with the same stable UUIDs
    node.run("gpu-sim", "set", "gpus.0.temperature_c", "50")
    assert "exists" in node.run("gpu-sim", "init").stdout
    assert node.state()["gpus"][0]["temperature_c"] == 50
    node.run("gpu-sim", "init", "--force", "--hostname", "dgx01")
    assert node.state()["gpus"] == state["gpus"]
    ports = node.root / "sysfs" / "class" / "infiniband"
    assert (ports / "mlx5_7" / "ports" / "1" / "state").read_text() == "4: ACTIVE\n"
    assert (ports / "mlx5_0" / "ports" / "1" / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    if os.geteuid() == 0:
        dev = node.root / "dev"
        assert {p.name for p in dev.iterdir()} >= {"nvidia0", "nvidia7", "nvidiactl", "nvidia-uvm"}
        assert os.major((dev / "nvidia3").stat().st_rdev) == 195


def test_nvidia_smi_query_csv(node: Node):
    out = node.run("nvidia-smi", "--query-gpu=index,name,memory.total,power.draw,temperature.gpu", "--format=csv")
    lines = out.stdout.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], power.draw [W], temperature.gpu"
    assert len(lines) == 9
    assert lines[1].startswith("0, NVIDIA H100 80GB HBM3, 81559 MiB, ")
    rows = node.query("index,memory.total,persistence_mode,driver_version,clocks_throttle_reasons.active")
    assert rows[3] == ["3", "81559", "Disabled", "580.95.05", "0x0000000000000000"]
    bad = node.run("nvidia-smi", "--query-gpu=index,bogus", "--format=csv", check=2)
    assert 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_nvidia_smi_other_views(node: Node):
    listing = node.run("nvidia-smi", "-L").stdout.splitlines()
    assert listing[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    report = node.run("nvidia-smi", "-q", "-i", "2").stdout
    assert "Driver Version                            : 580.95.05" in report  # the colon in column 42
    assert report.count("Product Name") == 1
    assert "GPU UUID" in report
    assert "Persistence Mode" in report
    assert "        State                             : Not Started" in report
    assert "Driver Version: 580.95.05" in node.run("nvidia-smi").stdout
    topo = node.run("nvidia-smi", "topo", "-m").stdout.splitlines()
    assert topo[1].split("\t")[1:9] == [" X "] + ["NV18"] * 7
    pm = node.run("nvidia-smi", "-pm", "1").stdout.splitlines()
    assert pm[0] == "Enabled persistence mode for GPU 00000000:18:00.0."
    assert {row[0] for row in node.query("persistence_mode")} == {"Enabled"}


def test_compute_apps_list_attached_processes_while_they_run(node: Node):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert node.run("nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv").stdout.splitlines() == [
            "pid, process_name"
        ]
        node.run("gpu-sim", "attach", "--gpu", "3", "--pid", str(sleeper.pid), "--memory", "2048")
        uuid3 = node.state()["gpus"][3]["uuid"]
        out = node.run("nvidia-smi", "--query-compute-apps=pid,process_name,gpu_uuid,used_memory", "--format=csv")
        name = os.readlink(f"/proc/{sleeper.pid}/exe")
        assert out.stdout.splitlines() == [
            "pid, process_name, gpu_uuid, used_gpu_memory [MiB]",
            f"{sleeper.pid}, {name}, {uuid3}, 2048 MiB",
        ]
        assert node.run("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader", "-i", "2").stdout == ""
        table = node.run("nvidia-smi").stdout
        assert f"{sleeper.pid}      C   {name}" in table and "No running processes found" not in table
        assert all(len(line) == 91 for line in table.splitlines()[1:] if line.startswith(("|", "+")))
        node.run("gpu-sim", "attach", "--gpu", "9", "--pid", str(sleeper.pid), check=1)
    finally:
        sleeper.kill()
        sleeper.wait()
    # a process that ended holds nothing, unless its context is stuck
    assert node.run("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""
    node.run("gpu-sim", "attach", "--gpu", "1", "--pid", str(sleeper.pid), check=1)
    node.run("gpu-sim", "attach", "--gpu", "1", "--pid", str(sleeper.pid), "--stuck")
    assert node.run("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout == f"{sleeper.pid}\n"
    node.run("gpu-sim", "detach")
    assert node.run("nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""


def test_driver_missing_and_mismatch(node: Node):
    (node.lib / "driver-version").write_text("580.105.08\n")  # upgraded package, old module still loaded
    mismatch = node.run("nvidia-smi", check=18)
    assert "Failed to initialize NVML: Driver/library version mismatch" in mismatch.stdout
    assert "NVML library version: 580.105.08" in mismatch.stdout
    node.run("gpu-sim", "reload")
    assert node.query("driver_version") == [["580.105.08"]] * 8
    (node.lib / "driver-version").unlink()
    missing = node.run("nvidia-smi", check=9)
    assert "couldn't communicate with the NVIDIA driver" in missing.stdout


def test_faults_change_outputs(node: Node):
    node.run("gpu-sim", "fault", "lost-gpu", "--gpu", "5")
    assert len(node.query("index")) == 7
    node.run("gpu-sim", "fault", "hot", "--gpu", "1")
    assert node.query("temperature.gpu")[1] == ["95"]
    node.run("gpu-sim", "fault", "nvlink-down", "--gpu", "2")
    status = node.run("nvidia-smi", "nvlink", "-s", "-i", "2").stdout
    assert "\t Link 3: <inactive>" in status
    assert "\t Link 4: 26.562 GB/s" in status
    node.run("gpu-sim", "fault", "ecc", "--gpu", "0")
    node.run("gpu-sim", "fault", "throttle", "--gpu", "0")
    fields = "ecc.errors.uncorrected.volatile.total,remapped_rows.pending,clocks_event_reasons.active"
    assert node.query(fields)[0] == ["1", "Yes", "0x0000000000000008"]
    node.run("gpu-sim", "fault", "ib-down")
    state_file = node.root / "sysfs" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "state"
    assert state_file.read_text() == "1: DOWN\n"
    node.run("gpu-sim", "clear", "hot")
    assert node.query("temperature.gpu")[1] == ["34"]  # back to its base temperature
    node.run("gpu-sim", "clear", "all")
    assert len(node.query("index")) == 8
    assert "<inactive>" not in node.run("nvidia-smi", "nvlink", "--status").stdout
    assert state_file.read_text() == "4: ACTIVE\n"
    node.run("gpu-sim", "set", "gpus.3.temperature_c", "77")
    assert node.query("temperature.gpu")[3] == ["77"]
    bad_index = node.run("gpu-sim", "set", "gpus.9.temperature_c", "1", check=1)
    assert bad_index.stderr == "gpu-sim: gpus.9: no such list item\n"


def test_gpu_sim_nvme_prints_the_smart_log_gpu_sim_keeps_for_each_drive(node: Node):
    """gpu-sim-nvme (the shell stand-in for `nvme smart-log`, which the lab's health check runs per drive) prints
    what `gpu-sim nvme-smart-log` prints from the state, through a warning, a drive gone and the clear."""
    nvme = str(STANDIN / "gpusim" / "gpu-sim-nvme")

    def both(device: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
        argv = [nvme, "smart-log", device, "--output-format=json"]
        shell = subprocess.run(argv, env=node.env, capture_output=True, text=True, check=False)
        return shell, node.run("gpu-sim", "nvme-smart-log", device, check=None)

    def same(device: str) -> dict:
        shell, python = both(device)
        assert (shell.returncode, shell.stdout) == (python.returncode, python.stdout) == (0, python.stdout), device
        return json.loads(shell.stdout)

    assert same("/dev/nvme3")["critical_warning"] == 0
    node.run("gpu-sim", "fault", "nvme-warning", "--device", "nvme3")
    node.run("gpu-sim", "fault", "nvme-missing", "--device", "nvme9")
    assert same("/dev/nvme3")["critical_warning"] == 0x04
    for device in ("/dev/nvme9", "/dev/nvme10", "/dev/sda"):
        shell, python = both(device)
        assert shell.returncode == python.returncode == 1, (device, shell, python)
        assert shell.stdout == python.stdout == ""
        assert "No such file or directory" in shell.stderr and "No such file or directory" in python.stderr
    wrong = subprocess.run([nvme, "smart-log", "/dev/nvme0", "-H"], env=node.env, capture_output=True, check=False)
    assert wrong.returncode == 2
    node.run("gpu-sim", "clear")
    assert same("/dev/nvme3")["critical_warning"] == 0 and same("/dev/nvme9")["media_errors"] == 0


def test_persistenced(node: Node):
    proc = node.start("nvidia-persistenced", "--user", "nvidia-persistenced", "--persistence-mode", "--verbose")
    wait_for(lambda: all(g["persistence_mode"] for g in node.state()["gpus"]))
    assert node.stop(proc) == 0
    assert not any(g["persistence_mode"] for g in node.state()["gpus"])


def test_fabricmanager(node: Node):
    assert node.run("nv-fabricmanager", "--version").stdout.strip() == "Fabric Manager version is : 580.95.05"
    cfg = str(STANDIN / "fabricmanager" / "fabricmanager.cfg")
    proc = node.start("nv-fabricmanager", "-c", cfg)
    wait_for(lambda: node.query("fabric.state,fabric.status") == [["Completed", "Success"]] * 8)
    assert node.state()["fm_running"] is True
    refused = node.run("gpu-sim", "reload", check=1)
    assert "nv-fabricmanager" in refused.stderr
    assert node.stop(proc) == 0
    assert node.state()["fm_running"] is False
    node.run("gpu-sim", "reload")
    assert node.query("fabric.state") == [["Not Started"]] * 8
    # a driver without the matching Fabric Manager
    node.install(driver="580.105.08")
    node.run("gpu-sim", "reload")
    mismatch = node.run("nv-fabricmanager", "-c", cfg, check=1)
    assert (
        "fabric manager NVIDIA GPU driver interface version 580.105.08 don't match with fabric manager version "
        "580.95.05. Please update with matching NVIDIA driver package." in mismatch.stderr
    )


def test_hostengine_dcgmi_and_exporter(node: Node, tmp_path: Path):
    engine_port, exporter_port = free_port(), free_port()
    host = f"127.0.0.1:{engine_port}"
    down = node.run("dcgmi", "discovery", "-l", "--host", host, check=255)
    assert "Error: unable to establish a connection to the specified host: 127.0.0.1" in down.stdout
    assert node.run("dcgmi", "--version").stdout.splitlines()[-1] == "Version : 4.2.3"

    engine = node.start("nv-hostengine", "-n", "--service-account", "nvidia-dcgm", "-p", str(engine_port))
    wait_for(lambda: node.run("dcgmi", "discovery", "-l", "--host", host, check=None).returncode == 0)
    discovery = node.run("dcgmi", "discovery", "-l", "--host", host).stdout
    assert discovery.startswith("8 GPUs found.")
    assert "NVIDIA H100 80GB HBM3" in discovery
    assert "00000000:DB:00.0" in discovery
    assert "nv-hostengine" in node.run("gpu-sim", "reload", check=1).stderr

    passed = json.loads(node.run("dcgmi", "diag", "-r", "1", "-j", "--host", host).stdout)
    assert passed["result"] == "Pass"
    assert len(passed["gpus"]) == 8
    node.run("gpu-sim", "fault", "xid", "--gpu", "4")
    failed = json.loads(node.run("dcgmi", "diag", "-r", "2", "-j", "--host", host, check=226).stdout)
    assert failed["result"] == "Fail"
    assert [g["index"] for g in failed["gpus"] if g["result"] == "Fail"] == [4]
    # DCGM's health watches: none until set (the host engine holds them), then the incidents gpu-sim's faults make
    assert "Health watches not enabled" in node.run("dcgmi", "health", "-c", "--host", host, check=1).stdout
    node.run("dcgmi", "health", "-s", "a", "--host", host)
    node.run("gpu-sim", "fault", "dcgm-dbe", "--gpu", "4")
    health = node.run("dcgmi", "health", "-c", "--host", host).stdout
    assert "| Overall Health            | Failure " in health and "|       -> Memory system    | Failure " in health
    assert "| -> 4                      | Failure " in health

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "2").write_text("4242\n")
    counters = tmp_path / "counters.csv"
    counters.write_text(
        (STANDIN / "dcgm-exporter" / "default-counters.csv").read_text() + "DCGM_FI_NOT_A_FIELD, gauge, nope.\n"
    )
    exporter = node.start(
        "dcgm-exporter",
        *("-f", str(counters), "-a", f"127.0.0.1:{exporter_port}", "-r", host),
        *("--hpc-job-mapping-dir", str(jobs), "-c", "1000"),
    )
    url = f"http://127.0.0.1:{exporter_port}/metrics"

    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return None

    metrics = wait_for(scrape)
    assert isinstance(metrics, str)
    assert "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C)." in metrics
    assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in metrics
    assert "DCGM_FI_NOT_A_FIELD" not in metrics
    uuid4 = node.state()["gpus"][4]["uuid"]
    assert (
        f'DCGM_FI_DEV_XID_ERRORS{{gpu="4",UUID="{uuid4}",pci_bus_id="00000000:9A:00.0",device="nvidia4",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="dgx01"}} 79'
    ) in metrics
    job_lines = [line for line in metrics.splitlines() if 'hpc_job="4242"' in line]
    assert job_lines
    assert all('gpu="2"' in line for line in job_lines)

    assert node.stop(engine) == 0
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(url, timeout=5)
    assert error.value.code == 500
    error.value.close()
    node.stop(exporter)
    assert "DCGM_FI_NOT_A_FIELD" in (exporter.stderr.read() if exporter.stderr else "")


def test_hostengine_refuses_without_driver(node: Node):
    (node.lib / "driver-version").unlink()
    assert node.run("nv-hostengine", "-n", "-p", str(free_port()), check=1).stderr == (
        "Err: Failed to start DCGM Server: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver. Make sure that the latest NVIDIA driver is installed and running.\n"
    )


def test_boot_and_first_driver_install(node: Node):
    node.run("gpu-sim", "set", "loaded_driver", "null")
    # what the real nvidia-smi prints (and its exit code 9) while no driver is loaded
    assert node.run("nvidia-smi", check=9).stdout == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    node.run("gpu-sim", "driver-installed")
    assert node.state()["loaded_driver"] == "580.95.05"
    node.install(driver="580.105.08")
    node.run("gpu-sim", "driver-installed")  # an upgrade does not change the loaded driver
    assert node.state()["loaded_driver"] == "580.95.05"
    node.run("gpu-sim", "boot")
    assert node.state()["loaded_driver"] == "580.105.08"


# --------------------------------------------------------------------------- packages and the apt repository

EXPECTED_APT = {
    ("gpu-sim", "1.0-1"),
    ("libnvidia-container-tools", "1.17.8-1"),
    ("cuda-drivers-550", "550.163.01-1"),
    ("cuda-drivers-580", "580.82.07-1"),
    ("cuda-drivers-580", "580.95.05-1"),
    ("cuda-drivers-580", "580.105.08-1"),
    ("nvidia-fabricmanager-550", "550.163.01-1"),
    ("libnvidia-nscq-550", "550.163.01-1"),
    ("nvidia-fabricmanager", "580.95.05-1"),
    ("libnvidia-nscq", "580.95.05-1"),
    ("nvidia-fabricmanager", "580.105.08-1"),
    ("libnvidia-nscq", "580.105.08-1"),
    ("datacenter-gpu-manager-4-core", "1:4.2.3-1"),
    ("datacenter-gpu-manager-4-cuda12", "1:4.2.3-1"),
    ("datacenter-gpu-manager-4-core", "1:4.1.1-1"),
    ("datacenter-gpu-manager-4-cuda12", "1:4.1.1-1"),
    ("grafana", "11.6.0"),
    ("corectl-standin-site-tools", "1.0"),  # corectl upgrade os: the old versions, installed by its e2e test
    ("linux-image-corectl-standin", "1.0"),
}
# the flat repositories beside apt/ that a test adds to a node's sources: published updates
EXPECTED_UPDATES = {
    "apt-updates": {
        ("corectl-standin-site-tools", "1.1"),
        ("linux-image-corectl-standin", "2.0"),
        ("linux-image-99.0.2-corectl-standin", "99.0.2-1"),
    },
    "apt-kernel": {("linux-image-corectl-standin", "3.0"), ("linux-image-99.0.3-corectl-standin", "99.0.3-1")},
}


# one pytest-xdist worker for every test of the repo fixture, so that enroot is built once (tests/conftest.py)
one_build = pytest.mark.xdist_group("standin_repo")


@pytest.fixture(scope="module")
def node_image() -> str:
    """The node image enroot is built in (from its upstream source)."""
    if not engine_ready():
        pytest.skip("the Docker engine is needed to build enroot")
    try:
        return ensure_image()
    except CorectlError as exc:
        pytest.skip(f"no node image to build enroot in: {exc}")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, node_image: str) -> Path:
    if not all(shutil.which(tool) for tool in BUILD_TOOLS):
        pytest.skip("dpkg-deb and gpg are needed to build the repo")
    out = tmp_path_factory.mktemp("standin-repo")
    result = subprocess.run(
        [sys.executable, str(STANDIN / "build_repo.py"), str(out), "--image", node_image],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(out)
    return out


def stanzas(text: str) -> list[dict[str, str]]:
    found = []
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if not line.startswith(" ") and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        found.append(fields)
    return found


@needs_build_tools
@one_build
def test_repo_index_and_packages(repo: Path):
    index = json.loads((repo / "index.json").read_text())
    for entry in index["packages"] + index["archives"]:
        path = repo / entry["path"]
        assert path.is_file(), entry
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    in_apt = {(p["name"], p["version"]) for p in index["packages"] if p["in_apt"] and p["path"].startswith("apt/")}
    assert in_apt == EXPECTED_APT
    for folder, expected in EXPECTED_UPDATES.items():
        assert {(s["Package"], s["Version"]) for s in stanzas((repo / folder / "Packages").read_text())} == expected
    assert index["apt"]["updates"] == sorted(EXPECTED_UPDATES)
    # the Slurm point release: Debian's packages of the node image's release under the next point version, each
    # depending on its siblings at exactly that version, the version the daemons print changed with it
    point = stanzas((repo / "apt-slurm" / "Packages").read_text())
    versions = {s["Package"]: s["Version"] for s in point}
    assert {"slurmctld", "slurmd", "slurmdbd", "slurm-client", "slurm-wlm-basic-plugins"} <= set(versions), versions
    [release] = set(versions.values())
    assert release.endswith("-1corectl1"), release
    assert index["apt"]["slurm"] == "apt-slurm"
    slurmd = next(s for s in point if s["Package"] == "slurmd")
    assert f"slurm-wlm-basic-plugins (= {release})" in slurmd["Depends"], slurmd
    with tempfile.TemporaryDirectory() as unpacked:
        plugins = next(s for s in point if s["Package"] == "slurm-wlm-basic-plugins")
        subprocess.run(["dpkg-deb", "-x", str(repo / "apt-slurm" / plugins["Filename"]), unpacked], check=True)
        [full] = Path(unpacked).rglob("libslurmfull.so")
        assert release.split("-")[0].encode() + b"\0" in full.read_bytes()
    standalone = {p["path"] for p in index["packages"] if not p["in_apt"]}
    assert standalone == {"enroot/v4.1.2/enroot_4.1.2-1_amd64.deb", "enroot/v4.1.2/enroot+caps_4.1.2-1_amd64.deb"}
    assert index["drivers"]["580.82.07"]["fabricmanager_package"] is None
    assert index["dcgm_exporter"]["path"] == "dcgm-exporter/4.2.3-4.1.3/dcgm-exporter_4.2.3-4.1.3_linux_amd64.tar.gz"
    assert index["pyxis"]["path"] == "pyxis/archive/refs/tags/v0.24.0.tar.gz"

    packages = (repo / "apt" / "Packages").read_text()
    assert gzip.decompress((repo / "apt" / "Packages.gz").read_bytes()).decode() == packages
    listed = stanzas(packages)
    assert {(s["Package"], s["Version"]) for s in listed} == EXPECTED_APT
    for stanza in listed:
        deb = repo / "apt" / stanza["Filename"]
        assert hashlib.sha256(deb.read_bytes()).hexdigest() == stanza["SHA256"]
        assert stanza["Maintainer"] == "corectl stand-ins <standin@corectl.invalid>"
    cuda12 = next(s for s in listed if s["Package"] == "datacenter-gpu-manager-4-cuda12" and "4.2.3" in s["Version"])
    assert cuda12["Depends"] == "datacenter-gpu-manager-4-core (= 1:4.2.3-1)"
    assert not any("580.82.07" in s["Version"] for s in listed if "fabricmanager" in s["Package"])

    release = (repo / "apt" / "Release").read_text()
    assert "Date: " in release
    assert f" {hashlib.sha256(packages.encode()).hexdigest()} " in release


@needs_build_tools
@one_build
def test_repo_signature_verifies(repo: Path):
    home = Path(tempfile.mkdtemp(prefix="gv", dir="/tmp"))  # short: gpg sockets live in the home directory
    try:
        keyring = home / "key.gpg"
        gpg = ["gpg", "--homedir", str(home), "--batch", "--no-default-keyring", "--keyring", str(keyring)]
        subprocess.run([*gpg, "--import", str(repo / "keys" / "corectl-standin.asc")], capture_output=True, check=True)
        verify = subprocess.run(
            [*gpg, "--verify", str(repo / "apt" / "InRelease")], capture_output=True, text=True, check=False
        )
        assert verify.returncode == 0, verify.stderr
        assert "Good signature" in verify.stderr
        for folder in ("apt", *EXPECTED_UPDATES, "apt-slurm"):  # one key signs every flat repository
            detached = [*gpg, "--verify", str(repo / folder / "Release.gpg"), str(repo / folder / "Release")]
            assert subprocess.run(detached, capture_output=True, check=False).returncode == 0
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)
    assert (repo / "keys" / "corectl-standin.asc").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


@needs_build_tools
@one_build
def test_second_build_is_a_noop(repo: Path, node_image: str):
    before = {p: p.stat().st_mtime_ns for p in repo.rglob("*") if p.is_file()}
    result = subprocess.run(
        [sys.executable, str(STANDIN / "build_repo.py"), str(repo), "--image", node_image],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(repo)
    assert {p: p.stat().st_mtime_ns for p in repo.rglob("*") if p.is_file()} == before


@needs_build_tools
@one_build
def test_archives(repo: Path):
    exporter = repo / "dcgm-exporter" / "4.2.3-4.1.3" / "dcgm-exporter_4.2.3-4.1.3_linux_amd64.tar.gz"
    pyxis = repo / "pyxis" / "archive" / "refs" / "tags" / "v0.24.0.tar.gz"
    for archive, top, members in (
        (exporter, "dcgm-exporter_4.2.3-4.1.3_linux_amd64", {"dcgm-exporter", "default-counters.csv"}),
        (pyxis, "pyxis-0.24.0", {"pyxis_slurmstepd.c", "Makefile", "spank_pyxis.lds"}),
    ):
        digest, name = (archive.parent / (archive.name + ".sha256")).read_text().split()
        assert name == archive.name
        assert digest == hashlib.sha256(archive.read_bytes()).hexdigest()
        with tarfile.open(archive) as tar:
            names = tar.getnames()
            assert {n.split("/", 1)[0] for n in names} == {top}
            assert {f"{top}/{m}" for m in members} <= set(names)
            if archive is exporter:
                assert tar.getmember(f"{top}/dcgm-exporter").mode & 0o111


@needs_build_tools
@one_build
def test_installed_layout_works(repo: Path, tmp_path: Path):
    """Unpack the packages like dpkg would and run the installed tools from that tree."""
    root = tmp_path / "root"
    for deb in (
        "apt/gpu-sim_1.0-1_all.deb",
        "apt/cuda-drivers-580_580.95.05-1_amd64.deb",
        "apt/nvidia-fabricmanager_580.95.05-1_amd64.deb",
        "apt/datacenter-gpu-manager-4-core_4.2.3-1_amd64.deb",
        "enroot/v4.1.2/enroot_4.1.2-1_amd64.deb",
    ):
        subprocess.run(["dpkg-deb", "-x", str(repo / deb), str(root)], check=True)
        control = tmp_path / "control" / Path(deb).name
        control.parent.mkdir(exist_ok=True)
        subprocess.run(["dpkg-deb", "-e", str(repo / deb), str(control)], check=True)
        for script in ("postinst", "prerm"):
            if (control / script).exists():
                subprocess.run(["sh", "-n", str(control / script)], check=True)
    lib = root / "usr" / "lib" / "gpu-sim"
    assert (lib / "driver-version").read_text().strip() == "580.95.05"
    unit = (root / "lib" / "systemd" / "system" / "nvidia-persistenced.service").read_text()
    assert "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose" in unit
    assert (root / "etc" / "enroot" / "hooks.d" / "98-nvidia.sh").is_file()
    assert (root / "usr" / "share" / "enroot" / "hooks.d" / "50-slurm-pmi.sh").is_file()
    env = dict(os.environ, GPU_SIM_STATE=str(tmp_path / "gpus.json"), GPU_SIM_LIB=str(lib))
    env.update(
        GPU_SIM_RUN=str(tmp_path / "run"), GPU_SIM_SYSFS=str(tmp_path / "sys"), GPU_SIM_DEV=str(tmp_path / "dev")
    )

    def tool(*argv: str) -> str:
        return subprocess.run(
            [sys.executable, str(root / "usr" / "bin" / argv[0]), *argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    tool("gpu-sim", "init")
    assert len(tool("nvidia-smi", "-L").splitlines()) == 8
    assert tool("nv-fabricmanager", "--version").strip() == "Fabric Manager version is : 580.95.05"
    assert "Version : 4.2.3" in tool("dcgmi", "--version")
    smart = subprocess.run(
        [str(root / "usr" / "bin" / "gpu-sim-nvme"), "smart-log", "/dev/nvme9", "--output-format=json"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(smart)["critical_warning"] == 0
    # the real enroot: its helpers are ELF binaries, its configuration enroot's own
    assert (root / "usr" / "bin" / "enroot-nsenter").read_bytes()[:4] == b"\x7fELF"
    assert "ENROOT_SQUASH_OPTIONS" in (root / "etc" / "enroot" / "enroot.conf").read_text()


def test_gpu_reset_is_refused_while_held_and_clears_what_a_reset_clears(node: Node):
    node.run("gpu-sim", "fault", "ecc", "--gpu", "2")
    node.run("gpu-sim", "fault", "nvlink-down", "--gpu", "2")
    node.run("gpu-sim", "fault", "xid", "--gpu", "4", "--xid", "48")
    proc = node.start("nvidia-persistenced", "--user", "nvidia-persistenced", "--persistence-mode")
    wait_for(lambda: all(g["persistence_mode"] for g in node.state()["gpus"]))
    refused = node.run("nvidia-smi", "--gpu-reset", check=255)
    assert "in use by another client (nvidia-persistenced)" in refused.stdout
    node.run("nvidia-smi", "-r", "-i", "2", check=255)  # held: refused before the single-GPU rule
    node.stop(proc)
    assert "reset all GPUs together" in node.run("nvidia-smi", "-r", "-i", "2", check=3).stdout
    done = node.run("nvidia-smi", "-r").stdout.splitlines()
    assert done[-1] == "All done." and len(done) == 9
    fields = "ecc.errors.uncorrected.volatile.total,remapped_rows.pending"
    assert node.query(fields)[2] == ["0", "No"]
    assert "<inactive>" not in node.run("nvidia-smi", "nvlink", "-s", "-i", "2").stdout
    # a reset does not clear the kernel log; a boot starts a new one
    assert "Xid" in node.run("gpu-sim", "kernel-log", "--since", "3600").stdout
    node.run("gpu-sim", "boot")
    assert "Xid" not in node.run("gpu-sim", "kernel-log", "--since", "3600").stdout


def test_an_xid_is_logged_to_the_nodes_journal_as_a_kernel_line(node: Node):
    """A node's journal gets each Xid as the kernel logs it (identifier kernel, facility kern, priority warning),
    so the node's syslog forwarding carries it to the log host as it does a real node's kernel lines."""
    folder = tempfile.mkdtemp(prefix="j", dir="/tmp")  # (a socket's path must be short)
    path = Path(folder) / "socket"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
            journal.bind(str(path))
            node.env["GPU_SIM_JOURNAL"] = str(path)
            node.run("gpu-sim", "fault", "xid", "--gpu", "4", "--xid", "48")
            journal.settimeout(10)
            received = journal.recv(65536).decode()
    finally:
        shutil.rmtree(folder)
    fields = dict(line.split("=", 1) for line in received.splitlines())
    logged = node.run("gpu-sim", "kernel-log").stdout.splitlines()
    assert fields == {"MESSAGE": logged[-1], "SYSLOG_IDENTIFIER": "kernel", "SYSLOG_FACILITY": "0", "PRIORITY": "4"}
    assert fields["MESSAGE"].startswith("NVRM: Xid (PCI:0000:") and ": 48, " in fields["MESSAGE"], fields


def test_a_lost_gpu_comes_back_after_a_power_cycle_not_a_reboot_and_a_dead_one_never(node: Node):
    node.run("gpu-sim", "fault", "lost-gpu", "--gpu", "5")
    node.run("gpu-sim", "fault", "dead-gpu", "--gpu", "6")
    assert "(reboot)" in node.run("gpu-sim", "boot").stdout
    assert len(node.query("index")) == 6
    mark = node.root / "power-on"
    mark.write_text("1795420000\n")  # what the stand-in BMC leaves before it powers the node on
    assert "(cold start)" in node.run("gpu-sim", "boot").stdout
    assert [row[0] for row in node.query("index")] == ["0", "1", "2", "3", "4", "5", "7"]
    assert not mark.exists()
    node.run("gpu-sim", "clear", "dead-gpu")
    assert len(node.query("index")) == 8


def test_modprobe_rmmod_and_a_boot_keep_only_the_configured_modules(node: Node):
    modules = node.root / "modules"
    load_d = node.root / "modules-load.d"

    def loaded() -> list[str]:
        return [line.split()[0] for line in modules.read_text().splitlines()]

    node.run("gpu-sim", "modprobe", "nvidia-peermem")  # the kernel's name has '_'
    node.run("gpu-sim", "modprobe", "nvidia_peermem")  # loaded already: nothing changes
    node.run("gpu-sim", "modprobe", "ib_umad")
    assert modules.read_text() == (
        "nvidia_peermem 16384 0 - Live 0x0000000000000000\nib_umad 16384 0 - Live 0x0000000000000000\n"
    )
    node.run("gpu-sim", "rmmod", "ib_umad")
    node.run("gpu-sim", "rmmod", "ib_umad")  # not loaded: still exit 0
    assert loaded() == ["nvidia_peermem"]
    node.run("gpu-sim", "modprobe", "bad name", check=2)
    # a boot forgets what was only modprobed and loads what modules-load.d names, in file-name order
    assert "(reboot)" in node.run("gpu-sim", "boot").stdout
    assert modules.read_text() == ""
    load_d.mkdir()
    (load_d / "nvidia-peermem.conf").write_text("# GPUDirect RDMA (corectl)\nnvidia-peermem\n\n")
    (load_d / "10-rdma.conf").write_text("; rdma\n  ib_umad  \nnvidia_peermem\n")
    (load_d / "ignored.txt").write_text("nope\n")
    node.run("gpu-sim", "modprobe", "dummy")
    node.run("gpu-sim", "boot")
    assert loaded() == ["ib_umad", "nvidia_peermem"]
    node.run("gpu-sim", "rmmod", "nvidia-peermem")
    assert loaded() == ["ib_umad"]
    node.run("gpu-sim", "boot")
    assert loaded() == ["ib_umad", "nvidia_peermem"]


CONTAINER_CLI = STANDIN / "container-cli" / "nvidia_container_cli.py"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_container_cli_binds_the_chosen_gpus_into_the_rootfs(tmp_path: Path):
    """As enroot's 98-nvidia.sh calls it, in a private mount namespace: the control devices and
    the chosen GPUs appear in ROOTFS/dev (regular files stand in for the device nodes here)."""
    dev, rootfs = tmp_path / "dev", tmp_path / "rootfs"
    dev.mkdir()
    rootfs.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text(f"{name}\n")
    env = dict(os.environ, GPU_SIM_DEV=str(dev))
    cli = [sys.executable, str(CONTAINER_CLI), "--user"]
    configure = [*cli, "configure", "--no-cgroups", "--ldconfig=@/sbin/ldconfig"]
    shown_dev = " ".join(f"{rootfs}/dev/{name}" for name in ("nvidia0", "nvidia2", "nvidiactl"))
    script = f'"$@" --utility --device=0,2 {rootfs} && cat {shown_dev}'
    shown = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", *configure],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["nvidia0", "nvidia2", "nvidiactl"]
    assert not (rootfs / "dev" / "nvidia1").exists()
    assert (rootfs / "dev" / "nvidia0").read_text() == ""  # outside the namespace: only the empty mount point
    refused = subprocess.run(
        [*configure, "--device=7", str(rootfs)], env=env, capture_output=True, text=True, check=False
    )
    assert refused.returncode == 1 and "7: unknown device" in refused.stderr
    version = subprocess.run([*cli, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("cli-version: 1.17.8")


# --------------------------------------------------------------------------- Grafana


def test_the_grafana_standin_serves_provisioned_dashboards_and_proxies_its_data_source(tmp_path: Path):
    """The stand-in Grafana (tests/standin/grafana) loads provisioning as Grafana does, refuses a broken file at
    start, serves viewers without an account, proxies the data source and wants the admin for a push."""
    import base64

    port, upstream = free_port(), free_port()
    prov, boards = tmp_path / "provisioning", tmp_path / "boards"
    (prov / "datasources").mkdir(parents=True)
    (prov / "dashboards").mkdir()
    boards.mkdir()
    (prov / "datasources" / "ds.yaml").write_text(
        f"apiVersion: 1\ndatasources:\n  - {{name: P, type: prometheus, uid: p1, url: 'http://127.0.0.1:{upstream}'}}\n"
    )
    (prov / "dashboards" / "d.yaml").write_text(
        f"apiVersion: 1\nproviders:\n  - {{name: c, folder: corectl, options: {{path: {boards}}}}}\n"
    )
    (boards / "a.json").write_text(json.dumps({"uid": "a", "title": "Alpha"}))
    ini = tmp_path / "grafana.ini"
    ini.write_text(f"[server]\nhttp_addr = 127.0.0.1\nhttp_port = {port}\n[security]\nadmin_password = s3cret\n"
                   "[auth.anonymous]\nenabled = true\n")  # fmt: skip
    grafana = [sys.executable, str(STANDIN / "grafana" / "grafana.py"), "server", f"--config={ini}"]
    (boards / "b.json").write_text(json.dumps({"title": "no uid"}))
    refused = subprocess.run([*grafana, f"cfg:default.paths.provisioning={prov}"], capture_output=True, text=True,
                             timeout=30, check=False)  # fmt: skip
    assert refused.returncode == 1 and "b.json: no uid or title" in refused.stderr
    (boards / "b.json").unlink()
    serve = [sys.executable, "-m", "http.server", str(upstream), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    data = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = subprocess.Popen([*grafana, f"cfg:default.paths.provisioning={prov}"], stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{base}/api/health"))
        search = json.loads(urllib.request.urlopen(f"{base}/api/search?type=dash-db").read())
        assert search == [{"uid": "a", "title": "Alpha", "type": "dash-db", "tags": [], "folderTitle": "corectl"}]
        (boards / "c.json").write_text(json.dumps({"uid": "c", "title": "Gamma"}))  # reread, as Grafana polls
        board = json.loads(urllib.request.urlopen(f"{base}/api/dashboards/uid/c").read())
        assert board["dashboard"]["title"] == "Gamma" and board["meta"]["provisioned"]
        wait_for(lambda: _answers(f"http://127.0.0.1:{upstream}/grafana.ini"))
        proxied = urllib.request.urlopen(f"{base}/api/datasources/proxy/uid/p1/grafana.ini").read().decode()
        assert "admin_password" in proxied  # the file the data source serves, through the proxy
        push = json.dumps({"dashboard": {"uid": "x", "title": "X"}}).encode()
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/dashboards/db", data=push, method="POST"))
        assert anonymous.value.code == 403  # a viewer may not write
        admin = urllib.request.Request(f"{base}/api/dashboards/db", data=push, method="POST")
        admin.add_header("Authorization", "Basic " + base64.b64encode(b"admin:s3cret").decode())
        assert json.loads(urllib.request.urlopen(admin).read())["uid"] == "x"
    finally:
        for proc in (server, data):
            proc.terminate()
            proc.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False

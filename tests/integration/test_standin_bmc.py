"""tests/standin/bmc.py: the stand-in BMC, driven by real clients (DMTF redfish library, ipmitool).

No Docker here: CORECTL_BMC_DOCKER points the BMC at a fake `docker` that keeps each container's
running state in a file and logs every call.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import redfish

from conftest import ROOT

BMC = ROOT / "tests" / "standin" / "bmc.py"
CONTAINER = "corectl-test-dgx01"
PASSWORD = "s3cret pw"  # a space, to see the password file is read whole
REDFISH_ADDR = "127.29.99.11"
IPMI_ADDR = "127.29.99.12"
needs_ipmitool = pytest.mark.skipif(shutil.which("ipmitool") is None, reason="ipmitool not installed")

FAKE_DOCKER = """#!{python}
import os, sys, time
state_dir = {state_dir!r}
args = sys.argv[1:]
with open(os.path.join(state_dir, "calls.log"), "a") as log:
    log.write(" ".join(args) + "\\n")
if args[0] == "cp":  # the power-on mark, copied into the (stopped) container
    sys.exit(0)
name = args[-1]
if args[0] in ("start", "kill"):
    time.sleep(float(os.environ.get("FAKE_DOCKER_DELAY", "0")))
state = os.path.join(state_dir, name + ".state")
if not os.path.exists(state):
    sys.exit(f"Error: No such container: {{name}}")
with open(state) as f:
    running = f.read().strip() == "running"
if args[0] == "inspect":
    print("true" if running else "false")
elif args[0] == "start":
    with open(state, "w") as f:
        f.write("running")
    print(name)
elif args[0] == "kill":
    if not running:
        sys.exit(f"Error response from daemon: container {{name}} is not running")
    with open(state, "w") as f:  # SIGKILL, or systemd halting on SIGRTMIN+3: it stops at once here
        f.write("exited")
    print(name)
else:
    sys.exit(f"fake docker: unexpected {{args}}")
"""


class FakeDocker:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.exe = root / "docker"
        self.exe.write_text(FAKE_DOCKER.format(python=sys.executable, state_dir=str(root)))
        self.exe.chmod(0o755)
        self.set_running(True)

    def set_running(self, running: bool) -> None:
        (self.root / f"{CONTAINER}.state").write_text("running" if running else "exited")

    def running(self) -> bool:
        return (self.root / f"{CONTAINER}.state").read_text() == "running"

    def remove(self) -> None:
        (self.root / f"{CONTAINER}.state").unlink()

    def actions(self, marks: bool = False) -> list[str]:
        """Calls other than inspect (and the power-on mark's cp, unless ``marks``), then forget them all."""
        log = self.root / "calls.log"
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        kept = [c for c in calls if not c.startswith("inspect ")]
        if marks:
            return [f"mark {c.split()[-1]}" if c.startswith("cp ") else c for c in kept]
        return [c for c in kept if not c.startswith("cp ")]


@dataclass
class Bmc:
    proc: subprocess.Popen[str]
    address: str
    port: int
    tmpdir: Path


def free_port(address: str, kind: socket.SocketKind) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


@pytest.fixture
def docker(tmp_path: Path) -> FakeDocker:
    return FakeDocker(tmp_path / "docker")


@pytest.fixture
def start_bmc(tmp_path: Path, docker: FakeDocker):
    procs: list[subprocess.Popen[str]] = []
    pwfile = tmp_path / "password"
    pwfile.write_text(PASSWORD + "\n")

    def start(protocol: str, docker_delay: float = 0, container: str = CONTAINER) -> Bmc:
        address = REDFISH_ADDR if protocol == "redfish" else IPMI_ADDR
        port = free_port(address, socket.SOCK_STREAM if protocol == "redfish" else socket.SOCK_DGRAM)
        tmpdir = tmp_path / f"tmp-{len(procs)}"
        tmpdir.mkdir()
        env = {
            **os.environ,
            "CORECTL_BMC_DOCKER": str(docker.exe),
            "TMPDIR": str(tmpdir),
            "FAKE_DOCKER_DELAY": str(docker_delay),
        }
        cmd = [
            sys.executable,
            str(BMC),
            "--protocol",
            protocol,
            "--address",
            address,
            "--port",
            str(port),
            "--container",
            container,
            "--system-name",
            "dgx01",
            "--user",
            "admin",
            "--password-file",
            str(pwfile),
            "--log",
            str(tmp_path / f"bmc-{len(procs)}.log"),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        assert line == f"bmc ready: {protocol} {address}:{port} {container}\n", line + proc.stdout.read()
        return Bmc(proc, address, port, tmpdir)

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()


def redfish_login(bmc: Bmc, password: str = PASSWORD):
    client = redfish.redfish_client(
        base_url=f"http://{bmc.address}:{bmc.port}", username="admin", password=password, timeout=10, max_retry=1
    )
    client.login(auth="basic")
    return client


def system_uri(client) -> str:
    members = client.get("/redfish/v1/Systems").dict["Members"]
    assert len(members) == 1
    return members[0]["@odata.id"]


def reset(client, uri: str, reset_type: str) -> int:
    target = client.get(uri).dict["Actions"]["#ComputerSystem.Reset"]["target"]
    return client.post(target, body={"ResetType": reset_type}).status


def test_redfish_power_control(start_bmc, docker: FakeDocker) -> None:
    client = redfish_login(start_bmc("redfish"))
    try:
        uri = system_uri(client)
        system = client.get(uri).dict
        assert (system["Id"], system["Name"], system["PowerState"]) == ("dgx01", "dgx01", "On")
        allowed = system["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"]
        assert {"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle", "GracefulRestart"} <= set(allowed)
        docker.actions()

        assert reset(client, uri, "ForceOff") == 204
        assert docker.actions() == [f"kill {CONTAINER}"]
        assert not docker.running()
        assert client.get(uri).dict["PowerState"] == "Off"

        assert reset(client, uri, "ForceOff") == 204  # already off: nothing to do
        assert docker.actions() == []

        assert reset(client, uri, "On") == 204
        # the node learns that its power was off (gpu-sim: a cold start brings back lost GPUs)
        mark = f"mark {CONTAINER}:/var/lib/gpu-sim/power-on"
        assert docker.actions(marks=True) == [mark, f"start {CONTAINER}"]
        assert client.get(uri).dict["PowerState"] == "On"

        assert reset(client, uri, "PowerCycle") == 204
        assert docker.actions(marks=True) == [f"kill {CONTAINER}", mark, f"start {CONTAINER}"]
        assert docker.running()
        assert client.get(uri).dict["PowerState"] == "On"

        assert reset(client, uri, "GracefulShutdown") == 204
        assert docker.actions() == [f"kill --signal=SIGRTMIN+3 {CONTAINER}"]
        assert client.get(uri).dict["PowerState"] == "Off"

        assert reset(client, uri, "ForceRestart") == 204  # from off: just power on
        assert docker.actions() == [f"start {CONTAINER}"]
        assert reset(client, uri, "GracefulRestart") == 204
        assert docker.actions() == [f"kill --signal=SIGRTMIN+3 {CONTAINER}", f"start {CONTAINER}"]
        assert client.get(uri).dict["PowerState"] == "On"

        assert reset(client, uri, "Nmi") == 400
        assert docker.actions() == []
    finally:
        client.logout()


def test_redfish_missing_container_is_off(start_bmc, docker: FakeDocker) -> None:
    docker.remove()
    client = redfish_login(start_bmc("redfish"))
    try:
        uri = system_uri(client)
        assert client.get(uri).dict["PowerState"] == "Off"
        assert reset(client, uri, "On") == 500  # docker start fails: the BMC says so
    finally:
        client.logout()


def test_redfish_rejects_wrong_credentials(start_bmc, docker: FakeDocker) -> None:
    bmc = start_bmc("redfish")
    with pytest.raises(redfish.rest.v1.InvalidCredentialsError):
        redfish_login(bmc, password="wrong")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"http://{bmc.address}:{bmc.port}/redfish/v1/Systems", timeout=10)
    assert exc.value.code == 401
    # the private temp dir holds the bcrypt htpasswd file, and nothing there holds the password
    (htpasswd,) = bmc.tmpdir.glob("*/htpasswd")
    assert htpasswd.read_text().startswith("admin:$2")
    assert PASSWORD not in htpasswd.read_text()


def ipmitool(bmc: Bmc, *args: str, password: str = PASSWORD) -> subprocess.CompletedProcess[str]:
    cmd = ["ipmitool", "-I", "lanplus", "-H", bmc.address, "-p", str(bmc.port), "-U", "admin", "-E", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=30, check=False, env={**os.environ, "IPMI_PASSWORD": password}
    )


def power_status(bmc: Bmc) -> str:
    result = ipmitool(bmc, "chassis", "power", "status")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_ipmitool
def test_ipmi_power_control(start_bmc, docker: FakeDocker) -> None:
    bmc = start_bmc("ipmi")
    assert power_status(bmc) == "Chassis Power is on"
    steps = [
        ("off", [f"kill {CONTAINER}"], "off"),
        ("off", [], "off"),
        ("on", [f"start {CONTAINER}"], "on"),
        ("cycle", [f"kill {CONTAINER}", f"start {CONTAINER}"], "on"),
        ("reset", [f"kill {CONTAINER}", f"start {CONTAINER}"], "on"),
        ("soft", [f"kill --signal=SIGRTMIN+3 {CONTAINER}"], "off"),
    ]
    for action, calls, state in steps:
        docker.actions()
        result = ipmitool(bmc, "chassis", "power", action)
        assert result.returncode == 0, (action, result.stderr)
        assert docker.actions() == calls, action
        assert docker.running() == (state == "on")
        assert power_status(bmc) == f"Chassis Power is {state}"


@needs_ipmitool
def test_ipmi_slow_cycle_happens_once(start_bmc, docker: FakeDocker) -> None:
    # ipmitool resends a request it has no answer to after 1 s; a slow cycle must not run again.
    bmc = start_bmc("ipmi", docker_delay=1.5)
    docker.actions()
    result = ipmitool(bmc, "chassis", "power", "cycle")
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)  # a duplicate would be handled right after the first
    assert docker.actions() == [f"kill {CONTAINER}", f"start {CONTAINER}"]
    assert power_status(bmc) == "Chassis Power is on"


@needs_ipmitool
def test_ipmi_rejects_wrong_password(start_bmc, docker: FakeDocker) -> None:
    bmc = start_bmc("ipmi")
    result = ipmitool(bmc, "chassis", "power", "off", password="wrong")
    assert result.returncode != 0
    assert "Chassis Power" not in result.stdout
    assert docker.actions() == []
    assert docker.running()


@pytest.mark.parametrize("protocol", ["redfish", "ipmi"])
def test_binds_only_the_given_address(start_bmc, protocol: str) -> None:
    bmc = start_bmc(protocol)
    kind = socket.SOCK_STREAM if protocol == "redfish" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as other:
        other.bind(("127.0.0.1", bmc.port))  # EADDRINUSE if the BMC had bound 0.0.0.0 or ::
        with socket.socket(socket.AF_INET, kind) as same, pytest.raises(OSError):
            same.bind((bmc.address, bmc.port))


@pytest.mark.parametrize("protocol", ["redfish", "ipmi"])
def test_sigterm_exits_cleanly(start_bmc, protocol: str) -> None:
    bmc = start_bmc(protocol)
    if protocol == "redfish":
        assert len(list(bmc.tmpdir.iterdir())) == 1  # its htpasswd dir
    start = time.monotonic()
    bmc.proc.send_signal(signal.SIGTERM)
    assert bmc.proc.wait(timeout=10) == 0
    assert time.monotonic() - start < 5
    assert list(bmc.tmpdir.iterdir()) == []


def test_lab_down_stops_bmcs_it_has_no_pid_file_for(start_bmc, tmp_path: Path) -> None:
    """`corectl lab down` from a new directory still stops the BMCs an earlier lab of the same
    name left running (they hold their ports); another lab's BMCs are left alone."""
    from corectl.lab import bmc as lab_bmc
    from corectl.site import Site

    # a container name of this test's own: stop_all stops every BMC serving it on this machine, and another
    # test's BMC (CONTAINER) may be running beside this one (make check runs two pytest workers)
    container = f"corectl-test-{os.getpid()}-dgx01"
    ours, theirs = start_bmc("redfish", container=container), start_bmc("ipmi", container=container)
    site = Site(root=ROOT, directory=tmp_path / "fresh" / "test")
    lab_bmc.stop_all(site, {"corectl-other-dgx01"})
    assert ours.proc.poll() is None and theirs.proc.poll() is None
    lab_bmc.stop_all(site, {container})
    assert ours.proc.wait(timeout=10) == 0 and theirs.proc.wait(timeout=10) == 0

"""Stand-in BMC for one lab node: a DGX H100's Redfish BMC, or a BMC speaking IPMI over LAN.

What is real: the protocol servers are the maintained emulators, sushy-tools (Redfish, over
plain HTTP with Basic auth) and pyghmi (IPMI 2.0 / RMCP+ over UDP), so clients (the DMTF
python-redfish-library, ipmitool, Ansible modules) talk real Redfish or real IPMI to it and
wrong credentials are refused. What is not: the node is a Docker container running systemd,
so "power" is the container's running state, driven through the Docker CLI:
On = docker start, ForceOff = docker kill, GracefulShutdown = SIGRTMIN+3 to systemd (it halts),
restart and power cycle = kill, wait until stopped, start. Actions finish before the reply.

    python tests/standin/bmc.py --protocol redfish|ipmi --address 127.29.10.11 --port 8000 \\
        --container corectl-lab-dgx01 --system-name dgx01 --user admin --password-file FILE [--log FILE]

Prints "bmc ready: <protocol> <address>:<port> <container>" once listening; SIGTERM/SIGINT end it
(exit 0). The docker executable is $CORECTL_BMC_DOCKER (default "docker").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bcrypt
import flask
from pyghmi.ipmi import bmc as ipmi_bmc
from pyghmi.ipmi.private import session as ipmi_session
from sushy_tools import error
from sushy_tools.emulator import main as sushy_main
from sushy_tools.emulator.resources.systems.base import AbstractSystemsDriver
from werkzeug.serving import make_server

LOG = logging.getLogger("corectl.standin.bmc")
# What ComputerSystem.Reset accepts here (sushy's template lists Nmi, not PowerCycle: we fix that).
RESET_TYPES = ("On", "ForceOn", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "PowerCycle")
WAIT_OFF_S = 30.0
POWER_ON_MARK = "/var/lib/gpu-sim/power-on"  # read by `gpu-sim boot` (tests/standin/gpusim)


class DockerPower:
    """Power of one node container, through the Docker CLI. One action at a time."""

    def __init__(self, container: str) -> None:
        self.container = container
        self._lock = threading.Lock()

    def _docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [os.environ.get("CORECTL_BMC_DOCKER", "docker"), *args, self.container]
        LOG.info("run: %s", " ".join(cmd))
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    def _must(self, *args: str) -> None:
        proc = self._docker(*args)
        if proc.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} {self.container} failed: {proc.stderr.strip()}")

    def _mark_power_on(self) -> None:
        """Tell the node, before it starts, that its power was off: a cold start clears what a reboot
        does not (gpu-sim brings back GPUs that fell off the bus). A node without gpu-sim has no
        such directory: the copy fails, and only the log says so."""
        with tempfile.NamedTemporaryFile("w", prefix="corectl-bmc-", suffix=".power-on") as mark:
            mark.write(f"{time.time():.0f}\n")
            mark.flush()
            target = f"{self.container}:{POWER_ON_MARK}"
            cmd = [os.environ.get("CORECTL_BMC_DOCKER", "docker"), "cp", mark.name, target]
            LOG.info("run: %s", " ".join(cmd))
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            LOG.warning("power-on mark not copied to %s: %s", target, proc.stderr.strip())

    def _power_on(self) -> None:
        self._mark_power_on()
        self._must("start")

    def is_on(self) -> bool:
        proc = self._docker("inspect", "-f", "{{.State.Running}}")
        if proc.returncode != 0:
            LOG.warning("container %s: inspect failed, reporting Off: %s", self.container, proc.stderr.strip())
            return False
        return proc.stdout.strip() == "true"

    def _wait_off(self) -> bool:
        deadline = time.monotonic() + WAIT_OFF_S
        while self.is_on():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def apply(self, action: str) -> None:
        """Carry out a Redfish ResetType; raises RuntimeError when docker fails."""
        with self._lock:
            LOG.info("power action %s on %s", action, self.container)
            running = self.is_on()
            if action in ("On", "ForceOn"):
                if not running:
                    self._power_on()
            elif action == "ForceOff":
                if running:
                    self._must("kill")
            elif action == "GracefulShutdown":  # systemd as PID 1 halts on SIGRTMIN+3; the container then exits
                if running:
                    self._must("kill", "--signal=SIGRTMIN+3")
            elif action in ("ForceRestart", "PowerCycle", "GracefulRestart"):
                if running and action == "GracefulRestart":
                    # A systemd "reboot" (SIGINT) in a container only ends the container, as a halt does;
                    # so: graceful halt, wait, then power on (hard kill if it has not stopped in time).
                    self._must("kill", "--signal=SIGRTMIN+3")
                    running = not self._wait_off()
                if running:
                    self._must("kill")
                    if not self._wait_off():
                        raise RuntimeError(f"{self.container} still running {WAIT_OFF_S:.0f}s after kill")
                self._power_on()
            else:
                raise ValueError(f"unsupported power action {action!r}")


class DockerSystemsDriver(AbstractSystemsDriver):
    """sushy systems driver: exactly one ComputerSystem (Id = Name = the node's name) backed by DockerPower."""

    def __init__(self, name: str, power: DockerPower) -> None:
        self._name = name
        self._uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
        self._power = power
        self._boot_device = "Hdd"

    def _check(self, identity: str) -> None:
        if identity not in (self._name, self._uuid):  # sushy's managers link systems by UUID
            raise error.NotFound(f"System {identity} not found")

    @property
    def driver(self) -> str:
        return "<docker>"

    @property
    def systems(self) -> list[str]:
        return [self._name]

    def uuid(self, identity: str) -> str:
        self._check(identity)
        return self._uuid

    def name(self, identity: str) -> str:
        self._check(identity)
        return self._name

    def get_power_state(self, identity: str) -> str:
        self._check(identity)
        return "On" if self._power.is_on() else "Off"

    def set_power_state(self, identity: str, state: str) -> None:
        self._check(identity)
        if state not in RESET_TYPES:
            raise error.BadRequest(f"ResetType {state!r} is not supported; use one of {', '.join(RESET_TYPES)}")
        try:
            self._power.apply(state)
        except (RuntimeError, subprocess.SubprocessError) as exc:
            raise error.FishyError(str(exc)) from exc

    def get_boot_device(self, identity: str) -> str:
        self._check(identity)
        return self._boot_device

    def set_boot_device(self, identity: str, boot_source: str) -> None:
        self._check(identity)
        self._boot_device = boot_source


class DockerApplication(sushy_main.Application):
    """sushy's Application whose `systems` is our driver instead of libvirt/nova/ironic/fake."""

    docker_systems: DockerSystemsDriver

    @property
    def systems(self) -> DockerSystemsDriver:  # type: ignore[override]
        return self.docker_systems


def _advertise_reset_types(response: flask.Response) -> flask.Response:
    """List in ResetType@Redfish.AllowableValues exactly what DockerSystemsDriver accepts."""
    if flask.request.endpoint == "system_resource" and flask.request.method == "GET" and response.status_code == 200:
        body = response.get_json()
        body["Actions"]["#ComputerSystem.Reset"]["ResetType@Redfish.AllowableValues"] = list(RESET_TYPES)
        response.set_data(json.dumps(body, indent=4))
    return response


def serve_redfish(args: argparse.Namespace, power: DockerPower, password: str, stop: Callable[[], None]) -> None:
    tmpdir = tempfile.mkdtemp(prefix="corectl-bmc-")  # mode 0700
    try:
        auth_file = Path(tmpdir) / "htpasswd"
        # bcrypt cost 4: every request is checked, and this hash never leaves the private temp dir.
        digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        auth_file.write_text(f"{args.user}:{digest}\n")
        app = sushy_main.app
        # sushy's routes use this module-level instance and choose the driver in its memoized
        # `systems` property; swapping the instance's class is the one override it needs.
        app.__class__ = DockerApplication
        app.docker_systems = DockerSystemsDriver(args.system_name, power)
        app.configure(extra_config={"SUSHY_EMULATOR_AUTH_FILE": str(auth_file)})  # adds Basic auth
        app.after_request(_advertise_reset_types)
        server = make_server(args.address, args.port, app, threaded=True)
        threading.Thread(target=server.serve_forever, name="redfish", daemon=True).start()
        announce(args)
        stop()
        server.shutdown()
        server.server_close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


# IPMI Chassis Control directives -> ResetType (4, the diagnostic interrupt, is refused).
IPMI_CONTROL = {0: "ForceOff", 1: "On", 2: "PowerCycle", 3: "PowerCycle", 5: "GracefulShutdown"}


class DockerIpmiBmc(ipmi_bmc.Bmc):
    """pyghmi BMC: chassis power status, and on/off/cycle/reset/soft mapped onto DockerPower."""

    def __init__(self, power: DockerPower, user: str, password: str, address: str, port: int) -> None:
        super().__init__({user: password}, port=port, address=address)  # binds (address, port) only
        self.power = power
        self._last: tuple[Any, int, int] | None = None  # session, sequence, completion code

    def get_power_state(self) -> str:
        return "on" if self.power.is_on() else "off"

    def control_chassis(self, request: dict[str, Any], session: Any) -> None:
        action = IPMI_CONTROL.get(request["data"][0])
        if action is None:
            return session.send_ipmi_response(code=0xCC)  # invalid data field
        # ipmitool resends a request it has no answer to within 1 s (same session and sequence),
        # and pyghmi would handle each copy once the slow docker call is over: act only once.
        if self._last is not None and self._last[0] is session and self._last[1] == session.seqlun:
            return session.send_ipmi_response(code=self._last[2])
        code = 0
        try:
            self.power.apply(action)
        except (RuntimeError, subprocess.SubprocessError):
            LOG.exception("IPMI power action %s failed", action)
            code = 0xFF  # unspecified error
        self._last = (session, session.seqlun, code)
        return session.send_ipmi_response(code=code)


def serve_ipmi(args: argparse.Namespace, power: DockerPower, password: str, stop: Callable[[], None]) -> None:
    # pyghmi wakes its IO thread with a datagram to its own socket at session.myself, which it sets to
    # ::1 or ::ffff:127.0.0.1 (127.0.0.1 for an IPv4 socket); ours is bound to args.address only, so
    # those wake-ups would be lost or reach another listener: aim them at our address instead.
    ipmi_session.myself = args.address
    bmc = DockerIpmiBmc(power, args.user, password, args.address, args.port)
    threading.Thread(target=bmc.listen, name="ipmi", daemon=True).start()
    announce(args)
    stop()
    bmc.serversocket.close()


def stop_signal() -> Callable[[], None]:
    """What blocks until SIGTERM or SIGINT has come (also one that came before it is called). The signals reach it
    through Python's wakeup fd, a pipe: no lock is taken in a signal handler. (An Event set by the handler could
    deadlock: the handler runs in the main thread, which may hold the Event's lock in its own wait.)"""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # the wakeup fd has the signal's number; nothing else to do

    def wait() -> None:
        os.read(read_end, 1)

    return wait


def announce(args: argparse.Namespace) -> None:
    print(f"bmc ready: {args.protocol} {args.address}:{args.port} {args.container}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("redfish", "ipmi"), required=True)
    parser.add_argument("--address", required=True, help="the only address bound, e.g. 127.29.10.11")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--container", required=True, help="Docker container standing in for the node")
    parser.add_argument("--system-name", required=True, help="Redfish ComputerSystem Id and Name")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-file", type=Path, required=True)
    parser.add_argument("--log", type=Path, help="log file (default: warnings only, to stderr)")
    args = parser.parse_args(argv)
    password = args.password_file.read_text().removesuffix("\n")
    if args.log:
        logging.basicConfig(filename=args.log, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    else:
        logging.basicConfig(level=logging.WARNING, format="bmc: %(name)s %(message)s")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no per-request lines
    power = DockerPower(args.container)
    serve = serve_redfish if args.protocol == "redfish" else serve_ipmi
    serve(args, power, password, stop_signal())
    LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

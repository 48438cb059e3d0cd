"""Out-of-band power through a node's BMC: Redfish (DMTF's redfish library) or IPMI (ipmitool).

One client per node; every call names the node and the BMC in its one-line error. A client does
three things to the power (on, off: hard, soft: ACPI shutdown), in each protocol's own words;
``wait_for`` polls until the BMC reports the state an action leads to. A power cycle is off, seen
off, then on (commands.power), so that a node seen on again has really been without power: a
BMC's own cycle can still report "On" before the node has gone down.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from corectl.errors import CorectlError
from corectl.site.model import NodeBmc

PowerState = Literal["on", "off"]
PowerAction = Literal["on", "off", "soft"]
# the state each action leads to, once the BMC has carried it out
TARGET: dict[str, PowerState] = {"on": "on", "off": "off", "soft": "off"}
REDFISH_RESET = {"on": "On", "off": "ForceOff", "soft": "GracefulShutdown"}
IPMI_POWER = {"on": "on", "off": "off", "soft": "soft"}
REQUEST_TIMEOUT_S = 15
IPMI_PASSWORD_MAX = 20  # bytes, IPMI 2.0


class BmcError(CorectlError):
    """A BMC could not be reached, refused the credentials or the action (one line)."""


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str


class PowerClient(Protocol):
    def state(self) -> PowerState: ...

    def act(self, action: PowerAction) -> None: ...


class RedfishClient:
    """ComputerSystem.PowerState and #ComputerSystem.Reset of the BMC's (first) system."""

    def __init__(self, node: str, bmc: NodeBmc, creds: Credentials, inventory: Path) -> None:
        self.node = node
        self.where = f"{node}: BMC {bmc.address}:{bmc.port} (redfish)"
        self.base_url = f"{bmc.scheme}://{bmc.address}:{bmc.port}"
        self.cafile = str(inventory / bmc.ca_file) if bmc.ca_file else None
        self.creds = creds
        self._system: str | None = None

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        import redfish
        from redfish.rest.v1 import RetriesExhaustedError, ServerDownOrUnreachableError

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # urllib3's InsecureRequestWarning: BMC certificates are self-signed
            try:
                client = redfish.redfish_client(
                    base_url=self.base_url,
                    username=self.creds.user,
                    password=self.creds.password,
                    cafile=self.cafile,
                    timeout=REQUEST_TIMEOUT_S,
                    max_retry=1,
                    check_connectivity=False,
                )
                client.login(auth="basic")
                response = client.get(path) if method == "GET" else client.post(path, body=body)
            except (RetriesExhaustedError, ServerDownOrUnreachableError, OSError) as exc:
                raise BmcError(f"{self.where}: unreachable ({type(exc).__name__})") from None
        if response.status == 401:
            raise BmcError(f"{self.where}: refused the credentials (401); see corectl secrets set-bmc")
        if not 200 <= response.status < 300:
            raise BmcError(f"{self.where}: {method} {path} answered {response.status}")
        try:
            return response.dict if response.text else {}
        except ValueError:
            raise BmcError(f"{self.where}: {method} {path}: not JSON") from None

    def _system_path(self) -> str:
        if self._system is None:
            members = self._request("GET", "/redfish/v1/Systems").get("Members") or []
            if not members:
                raise BmcError(f"{self.where}: lists no system")
            self._system = str(members[0]["@odata.id"])
        return self._system

    def state(self) -> PowerState:
        power = str(self._request("GET", self._system_path()).get("PowerState", ""))
        if power not in ("On", "Off", "PoweringOn", "PoweringOff"):
            raise BmcError(f"{self.where}: unknown power state {power!r}")
        return "on" if power in ("On", "PoweringOff") else "off"

    def act(self, action: PowerAction) -> None:
        system = self._request("GET", self._system_path())
        target = (system.get("Actions") or {}).get("#ComputerSystem.Reset", {}).get("target")
        if not target:
            raise BmcError(f"{self.where}: the system offers no #ComputerSystem.Reset action")
        self._request("POST", target, {"ResetType": REDFISH_RESET[action]})


class IpmiClient:
    """``ipmitool -I lanplus chassis power``; the password goes by environment (-E), never argv."""

    def __init__(self, node: str, bmc: NodeBmc, creds: Credentials) -> None:
        self.where = f"{node}: BMC {bmc.address}:{bmc.port} (ipmi)"
        self.argv = ["-I", "lanplus", "-H", bmc.address, "-p", str(bmc.port), "-U", creds.user, "-E"]
        self.password = creds.password
        if len(creds.password.encode()) > IPMI_PASSWORD_MAX:
            too_long = f"IPMI passwords are at most {IPMI_PASSWORD_MAX} bytes (corectl secrets set-bmc)"
            raise BmcError(f"{self.where}: {too_long}")

    def _power(self, word: str) -> str:
        tool = shutil.which("ipmitool")
        if tool is None:
            raise BmcError(f"{self.where}: ipmitool is not installed on the control host (apt install ipmitool)")
        env = {**os.environ, "IPMI_PASSWORD": self.password}
        try:
            proc = subprocess.run(
                [tool, *self.argv, "-N", "3", "-R", "2", "chassis", "power", word],
                env=env,
                capture_output=True,
                text=True,
                timeout=REQUEST_TIMEOUT_S * 2,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BmcError(f"{self.where}: no answer in {REQUEST_TIMEOUT_S * 2}s") from None
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise BmcError(f"{self.where}: chassis power {word}: {lines[-1] if lines else f'exit {proc.returncode}'}")
        return proc.stdout

    def state(self) -> PowerState:
        answer = self._power("status").strip().lower()
        if answer.endswith(" on"):
            return "on"
        if answer.endswith(" off"):
            return "off"
        raise BmcError(f"{self.where}: unexpected answer {answer[:60]!r}")

    def act(self, action: PowerAction) -> None:
        self._power(IPMI_POWER[action])


def client(node: str, bmc: NodeBmc, creds: Credentials, inventory: Path) -> PowerClient:
    if bmc.protocol == "ipmi":
        return IpmiClient(node, bmc, creds)
    return RedfishClient(node, bmc, creds, inventory)


def wait_for(power: PowerClient, want: PowerState, timeout: float, interval: float = 2.0) -> bool:
    """Poll until the BMC reports ``want``; False when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        if power.state() == want:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)

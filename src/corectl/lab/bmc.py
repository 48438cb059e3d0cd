"""The lab's BMCs: one stand-in per DGX container (tests/standin/bmc.py), on a loopback address.

A lab node at 172.29.10.11 has its BMC at 127.29.10.11: Redfish over HTTP on port 8000 for odd
nodes, IPMI over LAN on port 6230 for even ones, so that both protocols are used. Powering off
kills the container, powering on starts it again; the user and password are the lab's own
(.lab/bmc.password) and stored in the site's vault like a real site's (corectl secrets set-bmc).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from corectl.errors import CorectlError
from corectl.files import atomic_write
from corectl.site import Site, project_root

USER = "admin"
REDFISH_PORT = 8000
IPMI_PORT = 6230
READY = "bmc ready:"


def address(node_address: str) -> str:
    return "127." + node_address.split(".", 1)[1]


def protocol(index: int) -> str:
    """DGX stand-in number ``index`` (1-based): odd ones speak Redfish, even ones IPMI."""
    return "redfish" if index % 2 else "ipmi"


def declaration(node_address: str, index: int) -> dict:
    """The node's ``bmc`` in the lab's cluster.yml."""
    kind = protocol(index)
    if kind == "redfish":
        return {"address": address(node_address), "protocol": "redfish", "port": REDFISH_PORT, "scheme": "http"}
    return {"address": address(node_address), "protocol": "ipmi", "port": IPMI_PORT}


def password(site: Site) -> str:
    path = site.lab_dir / "bmc.password"
    if not path.is_file():
        # 16 characters: IPMI 2.0 passwords are at most 20 bytes
        atomic_write(path, (secrets.token_urlsafe(12) + "\n").encode(), 0o600)
    return path.read_text().strip()


def _pid_file(site: Site, node: str) -> Path:
    return site.lab_dir / f"bmc-{node}.pid"


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"standin/bmc.py" in cmdline else None


def start(site: Site, node: str, node_address: str, index: int, container: str, timeout: float = 30.0) -> None:
    """Start the node's stand-in BMC in the background (once; a running one is kept)."""
    pid_file = _pid_file(site, node)
    if _alive(pid_file):
        return
    password(site)
    decl = declaration(node_address, index)
    log = site.lab_dir / f"bmc-{node}.log"
    argv = [
        sys.executable, str(project_root() / "tests" / "standin" / "bmc.py"),
        "--protocol", decl["protocol"], "--address", decl["address"], "--port", str(decl["port"]),
        "--container", container, "--system-name", node, "--user", USER,
        "--password-file", str(site.lab_dir / "bmc.password"),
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if READY in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace").strip().splitlines()
    raise CorectlError(f"the stand-in BMC of {node} did not start: {tail[-1] if tail else 'no output'} (see {log})")


def _serving(containers: set[str], proc_root: Path = Path("/proc")) -> list[int]:
    """Stand-in BMCs powering these containers, found by their command lines: also those an
    earlier lab of the same name left behind (its directory, with the pid files, gone)."""
    found = []
    for entry in proc_root.glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        is_bmc = any(a.endswith("standin/bmc.py") for a in argv) and "--container" in argv[:-1]
        if is_bmc and argv[argv.index("--container") + 1] in containers:
            found.append(int(entry.name))
    return found


def stop_all(site: Site, containers: set[str]) -> None:
    """Stop the BMCs of the site's ``containers``."""
    for pid_file in site.lab_dir.glob("bmc-*.pid") if site.lab_dir.is_dir() else []:
        pid_file.unlink(missing_ok=True)
    for pid in _serving(containers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

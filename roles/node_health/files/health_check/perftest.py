"""InfiniBand RDMA write bandwidth between the two nodes of a Slurm job, port by port (perftest's ib_write_bw): the
ib-pair check of validation's pairwise round. This node serves on each of its ACTIVE ports in turn and the other
node of the job writes to it through srun, on the port of the same name (rail to rail, as DGX fabrics are cabled).
A port that trained at its full rate but carries less (a bad cable or transceiver, a congested or misrouted rail)
passes the ib check and fails this one."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from .core import CheckFailed, Node, Skip, _read, summarize

# one row of ib_write_bw's table: #bytes, #iterations, BW peak, BW average, MsgRate (tabs and spaces between)
WRITE_BW_ROW = re.compile(r"^\s*(\d+)\s+\d+\s+[0-9.]+\s+([0-9.]+)\s+[0-9.]+\s*$", re.M)
PERFTEST_PORT = 18515  # perftest's default TCP port for the connection setup; one more for each HCA


def write_bw(output: str) -> tuple[int, float] | None:
    """(message size, average bandwidth in Gb/s) of the table's largest message (--report_gbits)."""
    rows = [(int(size), float(average)) for size, average in WRITE_BW_ROW.findall(output)]
    return max(rows) if rows else None


def active_ib_ports(root: Path) -> list[tuple[str, str]]:
    """(device, port) of every ACTIVE InfiniBand port under the sysfs root."""
    found = []
    for port in sorted(root.glob("*/ports/*")):
        layer = _read(port / "link_layer")
        if (not layer or layer == "InfiniBand") and _read(port / "state").endswith("ACTIVE"):
            found.append((port.parent.parent.name, port.name))
    return found


def listening(port: int) -> bool:
    """Whether a socket of this host listens on the TCP port (/proc/net/tcp, tcp6: state 0A)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def job_partner() -> tuple[str, str]:
    """(this node, the other node) of a two-node Slurm job."""
    listed = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ.get("SLURM_JOB_NODELIST", "")],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    me = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    others = [name for name in listed.stdout.split() if name != me]
    if listed.returncode != 0 or len(others) != 1:
        raise CheckFailed(f"cannot tell the job's other node from {os.environ.get('SLURM_JOB_NODELIST', '')!r}")
    return me, others[0]


def one_port(node: Node, device: str, port: str, tcp: int, me: str, partner: str) -> float:
    """Serve on this node's device, let the partner write to it; the bandwidth the client measured (Gb/s)."""
    config = node.config
    timeout = float(config["ib_pair_timeout_s"])
    argv = [*config["ib_pair_command"], "-d", device, "-i", port, "-p", str(tcp)]
    server = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not listening(tcp):  # the client does not retry: it connects once the server listens
            if server.poll() is not None or time.monotonic() > deadline:
                said = (server.stdout.read() if server.stdout else "").strip().splitlines()
                raise CheckFailed(f"ib_write_bw server on {device} did not listen: {said[-1] if said else 'no output'}")
            time.sleep(0.1)
        launcher = [part.replace("{partner}", partner) for part in config["ib_pair_launcher"]]
        client = node.run(*launcher, *argv, me, timeout=timeout)
        found = write_bw(client.stdout)
        if client.rc != 0 or found is None:
            lines = [line.strip() for line in (client.stdout + client.stderr).splitlines() if line.strip()]
            raise CheckFailed(f"ib_write_bw {device} from {partner} failed (rc {client.rc}): "
                              f"{lines[-1] if lines else 'no output'}")  # fmt: skip
        return found[1]
    finally:
        if server.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(server.pid, signal.SIGKILL)
        server.communicate()


def check_ib_pair(node: Node) -> str:
    """Each ACTIVE InfiniBand port of this node, written to by the other node of this two-node Slurm job."""
    config = node.config
    nodes = os.environ.get("SLURM_JOB_NUM_NODES", "")
    if nodes != "2":
        raise Skip(f"runs inside a Slurm job of two nodes (this one: {nodes or 'no job'})")
    if config["ib_ports"] <= 0:
        raise Skip("no InfiniBand ports expected")
    ports = active_ib_ports(Path(config["ib_sysfs_root"]))
    if not ports:
        raise CheckFailed(f"no ACTIVE InfiniBand port under {config['ib_sysfs_root']}")
    me, partner = job_partner()
    expected = config["ib_write_bw_min_gbps"]
    measured = {device: one_port(node, device, port, PERFTEST_PORT + index, me, partner)
                for index, (device, port) in enumerate(ports)}  # fmt: skip
    slow = [f"{device} {gbps:.1f} Gb/s" for device, gbps in measured.items() if expected and gbps < expected]
    if slow:
        raise CheckFailed(f"ib_write_bw from {partner}: {summarize(slow)} < expected {expected} Gb/s")
    lowest = min(measured, key=measured.__getitem__)
    return f"ib_write_bw from {partner} on {len(measured)} ports: lowest {measured[lowest]:.1f} Gb/s ({lowest})" + (
        f" (expected >= {expected} Gb/s)" if expected else ""
    )

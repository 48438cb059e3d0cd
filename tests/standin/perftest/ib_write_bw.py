#!/usr/bin/python3
"""Stand-in for perftest's ib_write_bw (Debian's perftest package on real nodes), installed by the gpu-sim package
as /usr/bin/gpu-sim-ib-write-bw: a stand-in node has no RDMA device, only gpu-sim's simulated ports. Like the real
tool, started without a server name it waits for one client on TCP port -p; started with one it connects there
once (no retry) and both print the report (its layout follows the real NDR run in
tests/samples/ib_write_bw.ndr-ib.mlx5_0.report-gbits.txt). The bandwidth is the lower of the two ends' ports:
an ACTIVE port carries WRITE_EFFICIENCY of its rate, or the `write_bw_gbps` that `gpu-sim fault ib-slow` sets.
Only -d, -i, -p, -s, -n and the server name are read."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "gpusim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

WRITE_EFFICIENCY = 0.981  # the real NDR run: 392.34 of 400 Gb/s
WAIT_S = 120  # how long a server waits for its client
RULE = "-" * 87


def port_bandwidth(state: dict, device: str, port: int) -> tuple[float | None, str]:
    """(Gb/s the port carries, or None with perftest's own complaint)."""
    for entry in state.get("ib_ports", []):
        if entry["device"] == device and int(entry.get("port", 1)) == port:
            if entry.get("state") != "ACTIVE":
                return None, f" Port number {port} state is {entry.get('state', 'Down').capitalize()}"
            rate = float(entry.get("rate_gbps", gpusim.IB_RATE_GBPS))
            return float(entry.get("write_bw_gbps", rate * WRITE_EFFICIENCY)), ""
    return None, f" IB device {device} not found\n Unable to find the Infiniband/RoCE device"


def report(device: str, size: int, iterations: int, gbps: float) -> str:
    rate = gbps * 1e9 / 8 / size / 1e6
    return "\n".join([
        RULE,
        "                    RDMA_Write BW Test",
        f" Dual-port       : OFF\t\tDevice         : {device}",
        " Number of qps   : 1\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " TX depth        : 128",
        " Mtu             : 4096[B]",
        " Link type       : IB",
        RULE,
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
        f" {size:<10d} {iterations:<10d}       {gbps + 0.04:>8.2f}           {gbps:>8.2f} \t\t     {rate:.6f}",
        RULE,
    ])  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(prog="ib_write_bw")
    parser.add_argument("-d", "--ib-dev", default="mlx5_0")
    parser.add_argument("-i", "--ib-port", type=int, default=1)
    parser.add_argument("-p", "--port", type=int, default=18515)
    parser.add_argument("-s", "--size", type=int, default=65536)
    parser.add_argument("-n", "--iters", type=int, default=5000)
    parser.add_argument("server", nargs="?")
    args, _ = parser.parse_known_args()
    own, complaint = port_bandwidth(gpusim.load(), args.ib_dev, args.ib_port)
    if own is None:
        print(complaint, flush=True)
        return 1
    if args.server is None:
        print("\n************************************\n* Waiting for client to connect... *\n"
              "************************************", flush=True)  # fmt: skip
        with socket.create_server(("", args.port)) as server:
            server.settimeout(WAIT_S)
            conn, _ = server.accept()
            with conn:
                other = float(conn.recv(64).decode())
                conn.sendall(f"{own}".encode())
    else:
        try:
            with socket.create_connection((args.server, args.port), timeout=10) as conn:
                conn.sendall(f"{own}".encode())
                other = float(conn.recv(64).decode())
        except OSError:
            print(f"Couldn't connect to {args.server}:{args.port}\n"
                  " Unable to open file descriptor for socket connection Unable to init the socket connection",
                  flush=True)  # fmt: skip
            return 1
    print(report(args.ib_dev, args.size, args.iters, min(own, other)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

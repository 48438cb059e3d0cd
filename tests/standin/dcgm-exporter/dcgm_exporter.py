#!/usr/bin/python3
"""Stand-in for NVIDIA dcgm-exporter (shipped as the `dcgm-exporter` binary of the release tarball).

Stdlib only; it shares gpusim's host engine client (gpu-sim is on every simulated GPU node): every scrape asks
nv-hostengine for the GPU state over its JSON line protocol and renders the counters listed in the CSV file
as Prometheus text. It never reads the description file itself.

  dcgm-exporter [-f counters.csv] [-a [HOST]:9400] [-r HOST:PORT] [--hpc-job-mapping-dir DIR] [-c MS]
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

VERSION = "4.2.3-4.1.3"
DEFAULT_COUNTERS = "/etc/dcgm-exporter/default-counters.csv"

log = logging.getLogger("dcgm-exporter")

State = dict[str, Any]
Gpu = dict[str, Any]


def _last_xid(gpu: Gpu) -> int:
    events = gpu.get("xid_events") or []
    return int(events[-1]["xid"]) if events else 0


def _throttle(gpu: Gpu) -> int:
    return gpusim.throttle_mask(gpu.get("throttle_reasons", []))


def _nvlink_errors(gpu: Gpu, key: str) -> int:
    return sum(int(link.get(key, 0)) for link in gpu.get("nvlinks", []))


COUNTERS: dict[str, Callable[[State, Gpu], float | int]] = {
    "DCGM_FI_DEV_GPU_TEMP": lambda s, g: g["temperature_c"],
    "DCGM_FI_DEV_MEMORY_TEMP": lambda s, g: g["temperature_c"] + 4,
    "DCGM_FI_DEV_POWER_USAGE": lambda s, g: g["power_w"],
    "DCGM_FI_DEV_SM_CLOCK": lambda s, g: g["sm_clock_mhz"],
    "DCGM_FI_DEV_MEM_CLOCK": lambda s, g: 2619,
    # what a job makes of its GPUs: gpu-sim set gpus.N.utilization_pct / gpus.N.memory_used_mib (0 by default)
    "DCGM_FI_DEV_GPU_UTIL": lambda s, g: g.get("utilization_pct", 0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda s, g: 0,
    "DCGM_FI_DEV_XID_ERRORS": lambda s, g: _last_xid(g),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": lambda s, g: g["ecc"]["volatile_uncorrected"],
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda s, g: g["ecc"]["volatile_corrected"],
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": lambda s, g: g["ecc"]["aggregate_uncorrected"],
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": lambda s, g: 0,
    "DCGM_FI_DEV_ROW_REMAP_PENDING": lambda s, g: int(bool(g["ecc"]["remapped_rows_pending"])),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda s, g: int(bool(g["ecc"]["remapped_rows_failure"])),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda s, g: g["ecc"]["aggregate_uncorrected"],
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda s, g: 0,
    "DCGM_FI_DEV_RETIRED_PENDING": lambda s, g: int(bool(g["ecc"]["retired_pages_pending"])),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda s, g: 0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": lambda s, g: _nvlink_errors(g, "crc_errors"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": lambda s, g: _nvlink_errors(g, "replay_errors"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": lambda s, g: _nvlink_errors(g, "recovery_errors"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda s, g: 0,
    "DCGM_FI_DEV_FB_TOTAL": lambda s, g: s["memory_total_mib"],
    "DCGM_FI_DEV_FB_FREE": lambda s, g: s["memory_total_mib"] - g.get("memory_used_mib", 0),
    "DCGM_FI_DEV_FB_USED": lambda s, g: g.get("memory_used_mib", 0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda s, g: _throttle(g),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda s, g: _throttle(g),
}


def read_counters(path: Path) -> list[tuple[str, str, str]]:
    """(name, type, help) for every known counter line of a dcgm-exporter counters CSV."""
    counters = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2:
            log.warning("%s:%d: malformed line skipped: %s", path, number, line)
            continue
        name, kind = parts[0], parts[1]
        help_text = parts[2] if len(parts) > 2 else name
        if name not in COUNTERS:
            log.warning("Skipping line %d ('%s'): metric not enabled or not supported by the stand-in", number, name)
            continue
        if kind not in ("gauge", "counter"):
            log.warning("Skipping line %d ('%s'): unsupported metric type %s", number, name, kind)
            continue
        counters.append((name, kind, help_text))
    return counters


def query_hostengine(endpoint: str) -> State:
    host, _, port = endpoint.rpartition(":")
    reply = gpusim.hostengine_request(host or "localhost", int(port or gpusim.HOSTENGINE_PORT), {"op": "state"})
    if not reply.get("ok"):
        raise RuntimeError(reply.get("error", "host engine error"))
    return reply["state"]


def job_ids(mapping_dir: str | None, index: int) -> list[str]:
    if not mapping_dir:
        return []
    try:
        text = (Path(mapping_dir) / str(index)).read_text()
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(state: State, counters: list[tuple[str, str, str]], mapping_dir: str | None) -> str:
    hostname = state.get("hostname") or socket.gethostname()
    gpus = [g for g in state.get("gpus", []) if g.get("present", True)]
    lines = []
    for name, kind, help_text in counters:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for gpu in gpus:
            labels = (
                f'gpu="{gpu["index"]}",UUID="{_escape(gpu["uuid"])}",pci_bus_id="{_escape(gpu["pci_bus_id"])}",'
                f'device="nvidia{gpu["index"]}",modelName="{_escape(state.get("model", ""))}",'
                f'Hostname="{_escape(hostname)}"'
            )
            value = _number(COUNTERS[name](state, gpu))
            jobs = job_ids(mapping_dir, gpu["index"])
            if not jobs:
                lines.append(f"{name}{{{labels}}} {value}")
            for job in jobs:
                lines.append(f'{name}{{{labels},hpc_job="{_escape(job)}"}} {value}')
    return "\n".join(lines) + "\n"


class Exporter(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], options: argparse.Namespace, counters: list) -> None:
        super().__init__(address, Handler)
        self.options = options
        self.counters = counters


class Handler(BaseHTTPRequestHandler):
    server: Exporter
    server_version = f"dcgm-exporter/{VERSION}"

    def _send(self, code: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/metrics", "/health"):
            self._send(404, "404 page not found\n")
            return
        options = self.server.options
        try:
            state = query_hostengine(options.remote_hostengine_info)
        except (OSError, ValueError, RuntimeError) as exc:
            message = f"failed to collect metrics from DCGM host engine at {options.remote_hostengine_info}: {exc}\n"
            log.error(message.strip())
            self._send(500 if path == "/metrics" else 503, message)
            return
        if path == "/health":
            self._send(200, "OK\n")
            return
        body = render(state, self.server.counters, options.hpc_job_mapping_dir)
        self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return (host or "0.0.0.0"), int(port)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format='time="%(asctime)s" level=%(levelname)s msg="%(message)s"', level=logging.INFO)
    parser = argparse.ArgumentParser(prog="dcgm-exporter")
    parser.add_argument("-f", "--collectors", default=DEFAULT_COUNTERS)
    parser.add_argument("-a", "--address", default=":9400")
    parser.add_argument("-r", "--remote-hostengine-info", default="localhost:5555")
    parser.add_argument("--hpc-job-mapping-dir", default="")
    parser.add_argument("-c", "--collect-interval", type=int, default=30000)
    parser.add_argument("-v", "--version", action="store_true")
    args, unknown = parser.parse_known_args(argv)
    if args.version:
        print(f"dcgm-exporter version {VERSION}")
        return 0
    if unknown:
        log.warning("ignoring unsupported arguments: %s", " ".join(unknown))
    counters_path = Path(args.collectors)
    if not counters_path.is_file() and args.collectors == DEFAULT_COUNTERS:
        counters_path = Path(__file__).resolve().parent / "default-counters.csv"
    try:
        counters = read_counters(counters_path)
    except OSError as exc:
        log.error("cannot read counters file %s: %s", args.collectors, exc)
        return 1
    log.info("Starting dcgm-exporter %s (stand-in), %d counters from %s", VERSION, len(counters), counters_path)
    try:
        server = Exporter(parse_address(args.address), args, counters)
    except (OSError, ValueError) as exc:
        log.error("cannot listen on %s: %s", args.address, exc)
        return 1
    log.info("Starting webserver on %s", args.address)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(main())

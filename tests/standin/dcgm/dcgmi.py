#!/usr/bin/python3
"""Stand-in for dcgmi (installed as /usr/bin/dcgmi); talks to nv-hostengine over its JSON line protocol.

dcgmi --version
dcgmi discovery -l [--host H[:PORT]]
dcgmi diag -r 1|2|3|short|medium|long [-i 0,1] [-j] [--host H[:PORT]]     exit 0 pass, 226 fail
dcgmi health -c [-g GROUP] [--host H[:PORT]]      the watches' incidents (gpu-sim faults dcgm-*), in DCGM's table
dcgmi health -s SYSTEMS [--host H[:PORT]]          set the watches (the host engine holds them until it restarts)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

if TYPE_CHECKING:  # annotations only: a tool started on every health check imports no more than it runs
    from typing import Any

EXIT_NO_CONNECTION = 255
EXIT_DIAG_FAIL = 226
LEVELS = {"1": 1, "short": 1, "2": 2, "medium": 2, "3": 3, "long": 3, "4": 4, "xlong": 4}
TESTS = {
    1: ["software", "pcie", "memory"],
    2: ["software", "pcie", "memory", "diagnostic", "targeted_stress"],
    3: ["software", "pcie", "memory", "diagnostic", "targeted_stress", "targeted_power", "memory_bandwidth"],
    4: ["software", "pcie", "memory", "diagnostic", "targeted_stress", "targeted_power", "memory_bandwidth", "pulse"],
}
# How dcgmi names the tests and groups them in its table (tests/samples/dcgmi-diag-r3.*.txt).
TEST_NAMES = {
    "pcie": "PCIe",
    "memory": "GPU Memory",
    "diagnostic": "Diagnostic",
    "targeted_stress": "Targeted Stress",
    "targeted_power": "Targeted Power",
    "memory_bandwidth": "Memory Bandwidth",
    "pulse": "Pulse Test",
}
SECTION_OF = {"pcie": "Integration", "memory": "Hardware", "targeted_stress": "Stress"}
DEPLOYMENT_CHECKS = (
    "Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
    "Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom",
)  # fmt: skip
DEVICE_ID = "2330"  # H100 SXM5 80GB (PCI device id 0x2330, as in nvidia-smi's "Device Id : 0x233010DE")
SYSTEM_TO_TEST = {"memory": "memory", "pcie": "pcie", "nvlink": "pcie", "thermal": "diagnostic"}


class ConnectionFailedError(Exception):
    pass


def _endpoint(host: str | None) -> tuple[str, int]:
    text = host or "localhost"
    if text.startswith("unix://"):
        raise ConnectionFailedError(text)
    if text.count(":") == 1:
        name, port = text.split(":")
        return name, int(port)
    return text, gpusim.HOSTENGINE_PORT


def request(host: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    try:
        name, port = _endpoint(host)
        return gpusim.hostengine_request(name, port, payload)
    except (OSError, ValueError) as exc:
        raise ConnectionFailedError(str(exc)) from None


def fetch_state(host: str | None) -> dict[str, Any]:
    reply = request(host, {"op": "state"})
    if not reply.get("ok"):
        print(f"Error: {reply.get('error', 'host engine error')}", file=sys.stderr)
        raise SystemExit(1)
    return reply["state"]


def _gpus(state: dict[str, Any], ids: str | None) -> list[dict[str, Any]]:
    gpus = gpusim.present_gpus(state)
    if ids:
        wanted = {int(part) for part in ids.replace("gpu:", "").split(",") if part.strip().isdigit()}
        gpus = [g for g in gpus if g["index"] in wanted]
    return gpus


def _box(rows: list[tuple[str, str]], left: int = 6, right: int = 68) -> list[str]:
    """dcgmi's tables (tests/samples/dcgmi-*.txt): ("---", "") is a rule, ("===", "") the header
    rule, ("---", "Name") a section rule, ("", text) a continuation line."""
    rule = f"+{'-' * (left + 2)}+{'-' * (right + 2)}+"
    lines = [rule]
    for a, b in rows:
        if a == "===":
            lines.append(f"+{'=' * (left + 2)}+{'=' * (right + 2)}+")
        elif a == "---" and b:
            lines.append(f"|-----  {b}  ".ljust(left + 3, "-") + "+" + "-" * (right + 2) + "|")
        elif a == "---":
            lines.append(rule)
        else:
            lines.append(f"| {a:<{left}} | {b:<{right}} |")
    lines.append(rule)
    return lines


def cmd_discovery(args: argparse.Namespace) -> int:
    if not args.list:
        print("Usage: dcgmi discovery -l", file=sys.stderr)
        return 1
    state = fetch_state(args.host)
    gpus = gpusim.present_gpus(state)
    print(f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} found.")
    rows: list[tuple[str, str]] = [("GPU ID", "Device Information"), ("---", "")]
    for gpu in gpus:
        rows += [
            (str(gpu["index"]), f"Name: {state['model']}"),
            ("", f"PCI Bus ID: {gpu['pci_bus_id']}"),
            ("", f"Device UUID: {gpu['uuid']}"),
            ("---", ""),
        ]
    print("\n".join(_box(rows[:-1] if gpus else rows)))
    switches = 4 if state.get("nvswitch") else 0
    print(f"{switches} NvSwitch{'es' if switches != 1 else ''} found.")
    if switches:
        rows = [("Switch ID", "")] + [(str(i), "") for i in range(switches)]
        print("\n".join(_box(rows, 9, 0)))
    return 0


def evaluate(state: dict[str, Any], ids: str | None) -> list[dict[str, Any]]:
    now = time.time()
    results = []
    for gpu in _gpus(state, ids):
        incidents = gpusim.gpu_incidents(gpu, now)
        results.append(
            {
                "index": gpu["index"],
                "uuid": gpu["uuid"],
                "result": "Fail" if incidents else "Pass",
                "warnings": [i["message"] for i in incidents],
                "incidents": incidents,
            }
        )
    return results


def cmd_diag(args: argparse.Namespace) -> int:
    level = LEVELS.get(str(args.run).lower())
    if level is None:
        print(f"Error: invalid run level {args.run!r}", file=sys.stderr)
        return 1
    state = fetch_state(args.host)
    # a real diagnostic runs for minutes (gpu-sim's diag-slow fault: as long as it says); it ends early only
    # when it is killed
    deadline = time.monotonic() + float(state.get("diag_seconds", 0))
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    results = evaluate(state, args.gpus)
    overall = "Fail" if any(r["result"] == "Fail" for r in results) else "Pass"
    if args.json:
        gpus = [{"index": r["index"], "result": r["result"], "warnings": r["warnings"]} for r in results]
        print(json.dumps({"level": level, "result": overall, "gpus": gpus}, indent=2))
    else:
        print("Successfully ran diagnostic for group.")
        rows = [
            ("Diagnostic", "Result"),
            ("===", ""),
            ("---", "Metadata"),
            ("DCGM Version", gpusim.installed_dcgm() or "unknown"),
            ("Driver Version Detected", state.get("loaded_driver") or ""),
            ("GPU Device IDs Detected", ",".join(DEVICE_ID for _ in results)),
        ]
        for test in TESTS.get(level, TESTS[3]):
            if test == "software":
                rows += [("---", "Deployment"), *((name, "Pass") for name in DEPLOYMENT_CHECKS)]
                continue
            failed = [r for r in results if any(SYSTEM_TO_TEST[i["system"]] == test for i in r["incidents"])]
            if test in SECTION_OF:
                rows.append(("---", SECTION_OF[test]))
            verdict = f"Fail - GPU: {','.join(str(r['index']) for r in failed)}" if failed else "Pass - All"
            rows.append((TEST_NAMES[test], verdict))
            for r in failed:
                for incident in r["incidents"]:
                    if SYSTEM_TO_TEST[incident["system"]] == test:
                        rows.append(("Warning", f"GPU {r['index']} {incident['message']}"[:46]))
        print("\n".join(_box(rows, 25, 46)))
    return EXIT_DIAG_FAIL if overall == "Fail" else 0


# `dcgmi health -c` as DCGM prints it (tests/samples/dcgmi-health-c.*.txt): two columns, 25 and 56 characters
# wide, messages wrapped at 54; "Error: Health watches not enabled. ..." while no watch is set (NVIDIA/DCGM#176).
HEALTH_RULE = "+" + "-" * 27 + "+" + "-" * 58 + "+"
SEVERITY_ORDER = ("Healthy", "Warning", "Failure")


def _health_row(left: str, right: str) -> str:
    return f"| {left:<25} | {right:<56} |"


def health_table(incidents: list[dict[str, Any]]) -> str:
    worst = max((i["severity"] for i in incidents), key=SEVERITY_ORDER.index, default="Healthy")
    lines = [HEALTH_RULE, f"| {'Health Monitor Report':<85}|", HEALTH_RULE.replace("-", "="),
             _health_row("Overall Health", worst)]  # fmt: skip
    gpus = sorted({i["gpu"] for i in incidents})
    if gpus:
        lines.append(_health_row("GPU", ""))
    for gpu in gpus:
        mine = [i for i in incidents if i["gpu"] == gpu]
        lines.append(_health_row(f"-> {gpu}", max((i["severity"] for i in mine), key=SEVERITY_ORDER.index)))
        lines.append(_health_row("   -> Errors", ""))
        for incident in mine:
            lines.append(_health_row(f"      -> {incident['system']}", incident["severity"]))
            lines += [_health_row("", part) for part in textwrap.wrap(incident["message"], 54)]
    return "\n".join([*lines, HEALTH_RULE])


def cmd_health(args: argparse.Namespace) -> int:
    if args.set is not None:
        request(args.host, {"op": "health_set", "systems": args.set})
        print("Health monitor systems set successfully.")
        return 0
    if not args.check:
        print("Usage: dcgmi health -c | -s <systems>", file=sys.stderr)
        return 1
    if not request(args.host, {"op": "health_watches"}).get("systems"):
        print("Error: Health watches not enabled. Please enable watches. ")
        return 1
    state = fetch_state(args.host)
    print(health_table([i for gpu in gpusim.present_gpus(state) for i in gpusim.dcgm_health_incidents(gpu)]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dcgmi")
    parser.add_argument("--version", action="store_true")
    sub = parser.add_subparsers(dest="command")

    discovery = sub.add_parser("discovery")
    discovery.add_argument("-l", "--list", action="store_true")
    discovery.add_argument("--host")
    discovery.set_defaults(func=cmd_discovery)

    diag = sub.add_parser("diag")
    diag.add_argument("-r", "--run", required=True)
    diag.add_argument("-i", "--gpuList", dest="gpus")
    diag.add_argument("-g", "--group")
    diag.add_argument("-j", "--json", action="store_true")
    diag.add_argument("--host")
    diag.set_defaults(func=cmd_diag)

    health = sub.add_parser("health")
    health.add_argument("-c", "--check", action="store_true")
    health.add_argument("-s", "--set")
    health.add_argument("-g", "--group", default="0")
    health.add_argument("--host")
    health.set_defaults(func=cmd_health)
    return parser


def main(argv: list[str] | None = None) -> int:
    args, _unknown = build_parser().parse_known_args(argv)
    if args.version:
        print(f"dcgmi  version: {gpusim.installed_dcgm() or 'unknown'}")
        print(f"Version : {gpusim.installed_dcgm() or 'unknown'}")
        return 0
    if not getattr(args, "func", None):
        print("Usage: dcgmi <discovery|diag|health> ... | --version", file=sys.stderr)
        return 1
    try:
        return args.func(args)
    except ConnectionFailedError:
        host = (args.host or "localhost").split(":")[0]
        print(f"Error: unable to establish a connection to the specified host: {host}")
        print("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.")
        return EXIT_NO_CONNECTION


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())

"""The checks in order, each registered once with its settings (the manifest), running them, and the command line."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .core import (
    DEFAULT_CONFIG,
    SETTINGS,
    STANDARD_PATH,
    CheckFailed,
    ConfigError,
    Interrupted,
    Node,
    Skip,
    load_config,
)
from .diagnostics import check_dcgm_diag, check_dcgm_health
from .fabric import check_fabric, check_fabricmanager, check_fm_version
from .gpu import (
    check_driver_version,
    check_ecc,
    check_gpu_count,
    check_pcie,
    check_persistence,
    check_temperature,
    check_throttle,
)
from .memory import check_edac
from .nccl import check_nccl, check_nccl_pair
from .network import check_gpudirect, check_ib, check_ib_errors
from .nvlink import check_nvlink
from .perftest import check_ib_pair
from .services import check_clock, check_services
from .sticky import clear_sticky, read_sticky, when
from .storage import check_mounts, check_nvme
from .xid import check_aer, check_xid


class Check(NamedTuple):
    """One check as the manifest (`--list --json`) shows it: its name, and the settings it reads
    besides the general ones (GENERAL_SETTINGS)."""

    name: str
    run: Callable[[Node], str]
    settings: tuple[str, ...] = ()
    on_demand: bool = False  # runs only when named (--only): it takes the GPUs from jobs


# Read by many checks: whether there are GPUs and NVSwitches to look at, every command's timeout, and where
# failures seen as events are kept (sticky.py).
GENERAL_SETTINGS = ("gpu_count", "nvswitch", "command_timeout_s", "state_dir")

# The order matters: the first failure is what Slurm shows, so the most specific check comes first.
# Every check and every setting is registered here once; the role's defaults, argument spec and
# settings template, and corectl's health command, are held against this (tests/unit/test_health_manifest.py).
CHECKS: list[Check] = [
    Check("driver-version", check_driver_version, ("driver_version",)),
    Check("gpu-count", check_gpu_count, ("gpu_model",)),
    Check("fm-version", check_fm_version),
    Check("fabricmanager", check_fabricmanager, ("fabricmanager_service",)),
    Check("fabric", check_fabric),
    Check("persistence", check_persistence, ("persistence",)),
    Check("ecc", check_ecc, ("ecc_volatile_uncorrected_max",)),
    Check("nvlink", check_nvlink, ("nvlink_links", "nvlink_error_max")),
    Check("temperature", check_temperature, ("max_temperature", "max_memory_temperature")),
    Check("throttle", check_throttle, ("throttle_reasons",)),
    Check("pcie", check_pcie, ("pcie_replay_max",)),
    Check("xid", check_xid, ("xid_window_s", "xid_catalog", "xid_classes", "xid_command")),
    Check("aer", check_aer),
    Check("edac", check_edac, ("edac_sysfs_root", "edac_ue_max")),
    Check("ib", check_ib, ("ib_sysfs_root", "ib_rate_gbps", "ib_ports")),
    Check(
        "ib-errors",
        check_ib_errors,
        ("ib_error_counters", "ib_error_increase_max", "ib_link_downed_max", "ib_xmit_discards_increase_max"),
    ),
    Check("gpudirect", check_gpudirect, ("gpudirect_module", "modules_file")),
    Check("mounts", check_mounts, ("mounts",)),
    Check("nvme", check_nvme, ("nvme_count", "nvme_sysfs_root", "nvme_smart_command")),
    Check("services", check_services, ("services",)),
    Check("clock", check_clock, ("clock", "clock_unsynced_grace_s")),
    Check("dcgm-health", check_dcgm_health, ("dcgm_health",)),
    Check("dcgm-diag", check_dcgm_diag, ("dcgm_diag_level", "dcgm_diag_timeout_s")),
    Check("nccl", check_nccl, ("nccl_command", "nccl_busbw_min_gbps", "nccl_timeout_s"), on_demand=True),
    Check("nccl-pair", check_nccl_pair, ("nccl_pair_command", "nccl_pair_busbw_min_gbps"), on_demand=True),
    Check(
        "ib-pair",
        check_ib_pair,
        ("ib_pair_command", "ib_pair_launcher", "ib_write_bw_min_gbps", "ib_pair_timeout_s"),
        on_demand=True,
    ),
]
CHECK_NAMES = [check.name for check in CHECKS]


def type_name(kind: Any) -> str:
    """A setting's JSON type as the manifest names it: int, str, bool, list, or "list|str"."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return "|".join(k.__name__ for k in kinds)


def manifest() -> dict[str, Any]:
    """The checks in order with the settings each reads, and every setting's type and default."""
    return {
        "checks": [
            {"name": check.name, "settings": list(check.settings), "on_demand": check.on_demand} for check in CHECKS
        ],
        "general_settings": list(GENERAL_SETTINGS),
        "settings": {key: {"type": type_name(kind), "default": default} for key, (kind, default) in SETTINGS.items()},
    }


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def run_checks(config: dict[str, Any], only: list[str] | None = None, on_demand: bool = False) -> list[dict[str, str]]:
    node = Node(config)
    results = []
    for check in CHECKS:
        name = check.name
        if (only is not None and name not in only) or (check.on_demand and only is None and not on_demand):
            continue
        started = time.monotonic()
        try:
            status, message = "pass", check.run(node)
        except Skip as exc:
            status, message = "skip", str(exc)
        except Interrupted as exc:
            status, message = "interrupted", str(exc)
        except CheckFailed as exc:
            status, message = "fail", str(exc)
        except Exception as exc:  # a bug or an unexpected format must still name the check
            status, message = "fail", f"check error: {type(exc).__name__}: {exc}"
        results.append(
            {
                "name": name,
                "status": status,
                "message": one_line(message),
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    return results


def with_standard_path() -> None:
    """Slurm runs the health check with a minimal environment: make sure the tools are found."""
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    os.environ["PATH"] = os.pathsep.join(parts + [p for p in STANDARD_PATH if p not in parts])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="corectl-health-check", description="Node health checks of corectl.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"settings (default {DEFAULT_CONFIG})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--json", action="store_true", help="machine-readable result")
    mode.add_argument("--slurm", action="store_true", help="print '<check>: <message>' of the first failure")
    parser.add_argument("--level", type=int, choices=(0, 1, 2, 3), help="dcgmi diag level (0 = off)")
    parser.add_argument("--only", help=f"comma-separated checks: {','.join(CHECK_NAMES)}")
    parser.add_argument(
        "--validation", action="store_true", help="every check, the ones that take the GPUs (nccl) included"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the checks in order and exit (with --json: the manifest)"
    )
    parser.add_argument("--check-config", action="store_true", help="only validate the settings file")
    parser.add_argument(
        "--drain-as",
        metavar="PREFIX",
        help="on a failure drain this node in Slurm, reason 'PREFIX: <check>: <message>' (validation jobs)",
    )
    parser.add_argument(
        "--note-job",
        action="store_true",
        help="write the verdict into this Slurm job's AdminComment: '<pass|fail>: <check>: <message>'",
    )
    parser.add_argument(
        "--clear-sticky",
        metavar="BY",
        help="end the failures kept on this node (hardware Xids, lost GPUs), saying who does (heal, an operator)",
    )
    return parser.parse_args(argv)


def clear(config: dict[str, Any], by: str, as_json: bool) -> int:
    """--clear-sticky: what was kept, now ended."""
    cleared = clear_sticky(config, by or "unknown")
    if as_json:
        print(json.dumps({"node": socket.gethostname().split(".")[0], "cleared": cleared}, indent=2))
    for record in [] if as_json else cleared:
        print(f"cleared {record['check']}: {record['message']} (kept since {when(record['since'])})")
    return 0


REASON_MAX = 250  # characters of a drain reason (sinfo and squeue show far fewer)
KEPT_EXIT = 3  # --slurm: the first failure is kept on the node (hardware): its jobs are requeued where the site asks


def kept_checks(config: dict[str, Any]) -> set[str]:
    """The checks whose failures the node keeps now (sticky.py): a hardware failure, until heal or resume."""
    try:
        return {str(record.get("check")) for record in read_sticky(config)["records"]}
    except CheckFailed:  # an unreadable file: no record to go by
        return set()


def scontrol_update(what: str, target: str, *settings: str) -> None:
    """`scontrol update <target> <settings>`; a refusal is said on stderr (the verdict stands either way)."""
    argv = ["scontrol", "update", target, *settings]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        print(f"corectl-health-check: could not {what}: {result.stderr.strip()}", file=sys.stderr)


def drain(reason: str) -> None:
    """--drain-as: drain this node with the failure in its reason. Slurm's health program leaves a reason that is
    not its own alone, so the node stays drained until heal or an operator resumes it."""
    node = socket.gethostname().split(".")[0]
    scontrol_update(f"drain {node}", f"nodename={node}", "state=drain", f"reason={one_line(reason)[:REASON_MAX]}")


def note_job(text: str) -> None:
    """--note-job: the verdict where the job's submitter reads it (scontrol show job: AdminComment)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        print("corectl-health-check: --note-job outside a Slurm job: nothing noted", file=sys.stderr)
        return
    scontrol_update(f"note job {job}", f"jobid={job}", f"AdminComment={one_line(text)[:REASON_MAX]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(json.dumps(manifest(), indent=2) if args.json else "\n".join(CHECK_NAMES))
        return 0
    only = None
    if args.only:
        only = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in only if name not in CHECK_NAMES]
        if unknown:
            print(f"corectl-health-check: unknown checks: {', '.join(unknown)}", file=sys.stderr)
            return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"corectl-health-check: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        return 0
    if args.clear_sticky is not None:
        return clear(config, args.clear_sticky, args.json)
    if args.level is not None:
        config["dcgm_diag_level"] = args.level
    with_standard_path()
    return answer(args, config, run_checks(config, only, on_demand=args.validation))


def answer(args: argparse.Namespace, config: dict[str, Any], results: list[dict[str, str]]) -> int:
    """Act on the checks' results as asked (drain, note the job), print them, and the exit status."""
    ok = all(r["status"] not in ("fail", "interrupted") for r in results)
    failed = next((r for r in results if r["status"] == "fail"), None)
    if args.drain_as and failed and not any(r["status"] == "interrupted" for r in results):
        drain(f"{args.drain_as}: {failed['name']}: {failed['message']}")
    if args.note_job and results:
        shown = failed or next((r for r in results if r["status"] == "interrupted"), results[-1])
        note_job(f"{'pass' if ok else shown['status']}: {shown['name']}: {shown['message']}")
    if args.json:
        node = socket.gethostname().split(".")[0]
        print(json.dumps({"node": node, "ok": ok, "checks": results}, indent=2))
    elif args.slurm:
        first = next((r for r in results if r["status"] in ("fail", "interrupted")), None)
        if first:
            print(f"{first['name']}: {first['message']}")
        if first and first["status"] == "fail" and first["name"] in kept_checks(config):
            return KEPT_EXIT
    else:
        width = max(len(name) for name in CHECK_NAMES)
        for r in results:
            print(f"{r['status'].upper():4}  {r['name']:<{width}}  {r['message']}")
    return 0 if ok else 1

#!/usr/bin/python3
"""Stand-in for nv-fabricmanager (installed as /usr/bin/nv-fabricmanager); runs in the foreground.

  nv-fabricmanager --version | -v
  nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

Refuses to start without a loaded driver, or when the loaded driver differs from the installed Fabric Manager
version. Otherwise marks the fabric of every present GPU Completed/Success and blocks until SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

NAME = "fabricmanager"


def _fail(message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return 1


def _read_config(path: str | None) -> dict[str, str]:
    values: dict[str, str] = {}
    if not path:
        return values
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return values
    for raw in lines:
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nv-fabricmanager")
    parser.add_argument("-v", "--version", action="store_true")
    parser.add_argument("-c", "--config")
    args, _unknown = parser.parse_known_args(argv)

    fm_version = gpusim.installed_fm()
    if args.version:
        print(f"Fabric Manager version is : {fm_version or 'unknown'}")
        return 0
    if args.config and not Path(args.config).is_file():
        return _fail(f"fabric manager: failed to open config file {args.config}")
    config = _read_config(args.config)
    if fm_version is None:
        return _fail("fabric manager: installation is incomplete (no version information)")
    state = gpusim.load_or_none()
    if state is None or not state.get("loaded_driver"):
        return _fail("fabric manager: NVIDIA driver is not loaded")
    loaded = state["loaded_driver"]
    if loaded != fm_version:
        return _fail(
            f"fabric manager NVIDIA GPU driver interface version {loaded} don't match with fabric manager version "
            f"{fm_version}. Please update with matching NVIDIA driver package."
        )
    if not state.get("nvswitch"):
        return _fail("fabric manager: no NVSwitch devices found; fabric manager is not needed on this system")

    def start(current: dict) -> None:
        for gpu in gpusim.present_gpus(current):
            gpu["fabric"] = {"state": "Completed", "status": "Success"}
        current["fm_running"] = True

    gpusim.catch_termination()
    gpusim.write_pid(NAME)
    gpusim.update(start)
    log = config.get("LOG_FILE_NAME", "/var/log/fabricmanager.log")
    print(f"Fabric Manager {fm_version} started (log {log}); fabric training completed", file=sys.stderr, flush=True)
    gpusim.notify_ready()

    def stop() -> None:
        def stopped(current: dict) -> None:
            current["fm_running"] = False

        try:
            gpusim.update(stopped)
        finally:
            gpusim.remove_pid(NAME)

    return gpusim.run_until_terminated(stop)


if __name__ == "__main__":
    sys.exit(main())

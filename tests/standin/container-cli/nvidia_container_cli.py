#!/usr/bin/python3
"""Stand-in for NVIDIA's nvidia-container-cli (libnvidia-container-tools), as enroot's
98-nvidia.sh hook calls it inside a container's mount namespace:

    nvidia-container-cli [--user] [--debug=FILE] configure [--no-cgroups] [--ldconfig=PATH]
        [--device=all|none|I,J,...] [--utility] [--compute] ... [--require=EXPR] ROOTFS

It bind-mounts the GPUs' device nodes (the stand-in driver's /dev/nvidiaN, /dev/nvidiactl,
/dev/nvidia-uvm) into ROOTFS/dev, like the real one; it does not inject driver libraries or
binaries, and takes devices by index only (no UUIDs, no MIG). Also: --version, info.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from pathlib import Path

VERSION = "1.17.8"
MS_BIND = 4096
DEV = Path(os.environ.get("GPU_SIM_DEV", "/dev"))
CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
CAPABILITIES = ("--compute", "--compat32", "--display", "--graphics", "--utility", "--video")


def fail(message: str) -> int:
    print(f"nvidia-container-cli: {message}", file=sys.stderr)
    return 1


def gpus() -> list[int]:
    return sorted(int(p.name[6:]) for p in DEV.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name))


def bind(source: Path, rootfs: Path) -> None:
    target = rootfs / "dev" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.touch(exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(str(source).encode(), str(target).encode(), None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {source} at {target}")


def configure(args: list[str]) -> int:
    devices, rootfs = "", None
    for arg in args:
        if arg.startswith("--device="):
            devices = arg.split("=", 1)[1]
        elif arg in ("--no-cgroups", *CAPABILITIES) or arg.startswith(("--ldconfig=", "--require=", "--pid=")):
            continue
        elif arg.startswith("-"):
            return fail(f"configure: unrecognized option '{arg}'")
        elif rootfs is None:
            rootfs = Path(arg)
        else:
            return fail("configure: too many arguments")
    if rootfs is None or not rootfs.is_dir():
        return fail(f"configure: rootfs {rootfs} is not a directory")
    present = gpus()
    if not present:
        return fail("initialization error: nvml error: driver not loaded")
    if devices in ("", "none", "void"):
        wanted: list[int] = []
    elif devices == "all":
        wanted = present
    else:
        wanted = []
        for item in devices.split(","):
            if not item.isdigit() or int(item) not in present:
                return fail(f"device error: {item}: unknown device")
            wanted.append(int(item))
    try:
        for name in CONTROL:
            if (DEV / name).exists():
                bind(DEV / name, rootfs)
        for index in wanted:
            bind(DEV / f"nvidia{index}", rootfs)
    except OSError as exc:
        return fail(f"mount error: {exc.strerror}: {exc.filename or exc.args[-1]}")
    return 0


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--user" and not a.startswith(("--debug", "--load-kmods", "--no-pivot"))]
    if not args or args[0] in ("-V", "--version"):
        print(f"cli-version: {VERSION}\nlib-version: {VERSION}")
        return 0
    if args[0] == "info":
        print(f"NVRM version:   stand-in\nCUDA version:   stand-in\n\nDevice count: {len(gpus())}")
        return 0
    if args[0] == "configure":
        return configure(args[1:])
    return fail(f"unrecognized command '{args[0]}'")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

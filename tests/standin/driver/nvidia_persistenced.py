#!/usr/bin/python3
"""Stand-in for nvidia-persistenced (installed as /usr/bin/nvidia-persistenced); runs in the foreground.

--persistence-mode (the default) enables persistence mode on every present GPU; --no-persistence-mode leaves it.
On SIGTERM persistence mode is switched off again and the daemon exits 0. --user/--verbose are accepted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

NAME = "nvidia-persistenced"


def _set_mode(enable: bool) -> None:
    def apply(state: dict) -> None:
        for gpu in gpusim.present_gpus(state):
            gpu["persistence_mode"] = enable

    gpusim.update(apply)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=NAME)
    parser.add_argument("--user", "-u")
    parser.add_argument("--group", "-g")
    parser.add_argument("--verbose", "-V", action="store_true")
    parser.add_argument("--persistence-mode", dest="persistence", action="store_true", default=True)
    parser.add_argument("--no-persistence-mode", dest="persistence", action="store_false")
    parser.add_argument("--foreground", "-f", action="store_true", help="always the case for the stand-in")
    args, _unknown = parser.parse_known_args(argv)

    gpusim.catch_termination()
    state = gpusim.load_or_none()
    code, message = gpusim.driver_check(state)
    if code:
        print(f"{NAME}: Failed to initialize NVML: {message.splitlines()[0]}", file=sys.stderr)
        print(f"{NAME} failed to initialize. Check syslog for more details.", file=sys.stderr)
        return 1
    if args.persistence:
        _set_mode(True)
    gpusim.write_pid(NAME)
    print(f"{NAME}: Started (pid {gpusim.pid_file(NAME).read_text().strip()})", file=sys.stderr, flush=True)
    gpusim.notify_ready()

    def stop() -> None:
        try:
            _set_mode(False)
        finally:
            gpusim.remove_pid(NAME)
        print(f"{NAME}: Shutdown", file=sys.stderr, flush=True)

    return gpusim.run_until_terminated(stop)


if __name__ == "__main__":
    sys.exit(main())

"""Writes the programs the roles ship as zipapps (PEP 441: a ``#!/usr/bin/python3`` line and a zip archive that
Python runs), each from its package beside it, modules kept as they are: the package and an entry point that runs
its ``main``. An archive is the same bytes on every machine (entries sorted, stored uncompressed, every time and
mode fixed), so the committed files can be checked against their packages (tests/unit/test_zipapps.py).

    python3 tools/zipapps.py          write them
    python3 tools/zipapps.py --check  exit 1 when one is stale
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SHEBANG = b"#!/usr/bin/python3\n"
STAMP = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


class Zipapp(NamedTuple):
    target: str  # the file the role installs, from the project's root
    package: str  # the package's directory beside it
    entry: str  # the module whose main() is the program

    def archive(self) -> bytes:
        package = ROOT / self.package
        files = [entry("__main__.py", main_module(Path(self.target).name, package.name, self.entry).encode())]
        files += [entry(f"{package.name}/{path.name}", path.read_bytes()) for path in sorted(package.glob("*.py"))]
        buffer = io.BytesIO()
        buffer.write(SHEBANG)
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zipped:
            for info, data in files:
                zipped.writestr(info, data)
        return buffer.getvalue()


ZIPAPPS = (
    Zipapp("roles/node_health/files/corectl-health-check", "roles/node_health/files/health_check", "checks"),
    Zipapp("roles/backup/files/corectl-backup", "roles/backup/files/corectl_backup", "cli"),
)


def main_module(program: str, package: str, module: str) -> str:
    return (
        f'"""{program}: the zipapp of its package {package} (tools/zipapps.py builds it)."""\n\n'
        "import signal\nimport sys\n\n"
        f"from {package}.{module} import main\n\n"
        "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\nsys.exit(main())\n"
    )


def entry(name: str, data: bytes) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name, date_time=STAMP)
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever machine builds it
    return info, data


def main(argv: list[str]) -> int:
    stale = []
    for app in ZIPAPPS:
        target, data = ROOT / app.target, app.archive()
        if "--check" not in argv:
            target.write_bytes(data)
            target.chmod(0o755)
        elif not target.is_file() or target.read_bytes() != data:
            stale.append(app.target)
    for name in stale:
        print(f"{name}: stale; run python3 tools/zipapps.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

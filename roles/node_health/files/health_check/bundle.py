"""Writes the one file the role ships, ../corectl-health-check: a zipapp (PEP 441: a ``#!/usr/bin/python3`` line
and a zip archive that Python runs) holding this package as it is, modules by domain, and an entry point that
runs it. The archive is the same bytes on every machine (entries sorted, stored uncompressed, every time and
mode fixed), so the committed file can be checked against the package.

    python3 roles/node_health/files/health_check/bundle.py          write it
    python3 roles/node_health/files/health_check/bundle.py --check  exit 1 when it is stale
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "corectl-health-check"
SHEBANG = b"#!/usr/bin/python3\n"
ENTRY = '''"""corectl-health-check: roles/node_health/files/health_check/ as a zipapp (its bundle.py builds it)."""

import signal
import sys

from health_check.checks import main

signal.signal(signal.SIGPIPE, signal.SIG_DFL)
sys.exit(main())
'''
LEFT_OUT = {"bundle.py"}  # this builder; the package's own __main__.py (python3 -m health_check) is kept
STAMP = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def entry(name: str, data: bytes) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name, date_time=STAMP)
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever machine builds it
    return info, data


def archive() -> bytes:
    files = [entry("__main__.py", ENTRY.encode())]
    files += [
        entry(f"{HERE.name}/{path.name}", path.read_bytes())
        for path in sorted(HERE.glob("*.py"))
        if path.name not in LEFT_OUT
    ]
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zipped:
        for info, data in files:
            zipped.writestr(info, data)
    return buffer.getvalue()


def main(argv: list[str]) -> int:
    data = archive()
    if "--check" in argv:
        current = TARGET.read_bytes() if TARGET.is_file() else b""
        if current != data:
            print(f"{TARGET}: stale; run python3 {Path(__file__)}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_bytes(data)
    TARGET.chmod(0o755)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

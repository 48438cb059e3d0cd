#!/usr/bin/python3
"""Debian's own Slurm packages under the next point version: the stand-in for a Slurm point release (corectl
upgrade slurm's end-to-end test). Run as root in a throwaway container of the node image, which reaches Debian's
mirror:

    slurm-point-release.py OUTDIR

Every binary package of Debian's source package slurm-wlm for amd64 and all (what a node may have installed: a
package left at the old version would hold its siblings back, their dependencies are exact: the plugins' -dev
packages come with libpmix-dev), except debug and doc packages, is downloaded as Debian ships it and repacked:
- its version: upstream 22.05.8 -> 22.05.9, Debian revision "1corectl1" (newer than any Debian revision of
  22.05.8), in Version and in every exact dependency on a sibling;
- the daemons' and commands' own version string, 22.05.8 -> 22.05.9, wherever it is stored in the package's
  files (the same length, so the binaries are otherwise unchanged): `slurmd -V`, slurmctld's SLURM_VERSION, the
  Version a slurmd registers with, slurmdbd's start-up line all say the new version. Slurm's numeric version
  (SLURM_VERSION_NUMBER, checked between a daemon and its plugins) and protocol version are left as they are:
  a point release keeps both.
Nothing is rebuilt from source: what runs is Debian's build, only the version it reports differs.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = "slurm-wlm"
LEFT_OUT = re.compile(r"(-doc|-dbgsym|-dbg)$")
REVISION = "1corectl1"


def run(*argv: str, cwd: Path | None = None) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, cwd=cwd).stdout


def binary_packages() -> list[str]:
    """The binary packages of SOURCE the mirror offers for amd64 (arch-specific and arch-all), by apt's lists."""
    names: set[str] = set()
    lists = Path("/var/lib/apt/lists")
    for index in lists.glob("*_Packages"):
        for stanza in index.read_text(errors="replace").split("\n\n"):
            fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", stanza, re.MULTILINE))
            source = fields.get("Source", fields.get("Package", "")).split(" ")[0]
            if source == SOURCE and not LEFT_OUT.search(fields["Package"]):
                names.add(fields["Package"])
    return sorted(names)


def next_point(upstream: str) -> str:
    major, minor, point = upstream.split(".")
    bumped = f"{major}.{minor}.{int(point) + 1}"
    if len(bumped) != len(upstream):
        raise SystemExit(f"slurm-point-release: {upstream} -> {bumped} changes the string's length")
    return bumped


def repack(deb: Path, out: Path) -> str:
    """The package repacked under the next point version; returns the new .deb's name."""
    with tempfile.TemporaryDirectory(prefix="repack-") as tmp:
        root = Path(tmp) / "root"
        run("dpkg-deb", "--raw-extract", str(deb), str(root))
        control = (root / "DEBIAN" / "control").read_text()
        version = re.search(r"^Version: (\S+)$", control, re.MULTILINE).group(1)
        upstream = version.split("-")[0].split(":")[-1]
        point = next_point(upstream)
        renamed = f"{point}-{REVISION}"
        control = control.replace(f"(= {version})", f"(= {renamed})")
        control = re.sub(r"^Version: \S+$", f"Version: {renamed}", control, flags=re.MULTILINE)
        control = re.sub(r"^Source: (\S+) \(\S+\)$", r"Source: \1", control, flags=re.MULTILINE)
        (root / "DEBIAN" / "control").write_text(control)
        old, new = upstream.encode(), point.encode()
        sums = []
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            relative = path.relative_to(root)
            if relative.parts[0] == "DEBIAN":
                continue
            data = path.read_bytes()
            if old in data:
                path.write_bytes(data.replace(old, new))
            sums.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {relative}\n")
        if (root / "DEBIAN" / "md5sums").exists():
            (root / "DEBIAN" / "md5sums").write_text("".join(sums))
        name = f"{deb.name.split('_')[0]}_{renamed}_{deb.name.rsplit('_', 1)[-1]}"
        run("dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out / name))
        return name


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    os.environ["DEBIAN_FRONTEND"] = "noninteractive"
    run("apt-get", "update", "-qq")
    names = binary_packages()
    if not names:
        raise SystemExit(f"slurm-point-release: the mirror offers no package of {SOURCE}")
    with tempfile.TemporaryDirectory(prefix="download-") as tmp:
        run("apt-get", "download", "-qq", *names, cwd=Path(tmp))
        for deb in sorted(Path(tmp).glob("*.deb")):
            print(repack(deb, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

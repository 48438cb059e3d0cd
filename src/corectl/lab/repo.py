"""The stand-in package repository: NVIDIA's and GitHub's downloads, replaced for tests.

tests/standin/build_repo.py builds signed apt packages with the real names and versions (driver,
Fabric Manager, NSCQ, DCGM) and a dcgm-exporter archive; it adds the real enroot (release .debs
built from the upstream source) and pyxis (the upstream source archive). A container on the test
network serves them over HTTP; roles reach them through their normal URL variables (only the base
URL differs from production).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from corectl.errors import CorectlError
from corectl.lab.docker import LABEL, accounting_flags, docker, ensure_engine
from corectl.lab.image import ensure_image
from corectl.site import project_root

PORT = 8080


def build_dir() -> Path:
    return project_root() / "build" / "standin-repo"


def build() -> Path:
    """Build (or keep, when its sources are unchanged) the repository on this machine."""
    script = project_root() / "tests" / "standin" / "build_repo.py"
    out = build_dir()
    argv = [sys.executable, str(script), str(out), "--image", ensure_image()]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        detail = lines[-1] if lines else proc.returncode
        raise CorectlError(f"building the stand-in package repository failed: {detail}")
    return out


def url(address: str) -> str:
    return f"http://{address}:{PORT}"


def serve(container: str, network: str, address: str, label: str) -> str:
    """Run the HTTP server container (idempotent); return the repository's base URL."""
    ensure_engine()
    root = build()
    state = docker("ps", "-a", "--filter", f"name=^{container}$", "--format", "{{.State}}").strip()
    if state:
        networks = "{{range $n, $c := .NetworkSettings.Networks}}{{$n}} {{$c.IPAddress}}{{end}}"
        where = docker("inspect", container, "--format", networks).strip()
        if state != "running" or where != f"{network} {address}":
            docker("rm", "--force", container)  # stopped, or left over from another network
            state = ""
    if not state:
        docker(
            "run",
            "--detach",
            f"--name={container}",
            f"--network={network}",
            f"--ip={address}",
            f"--label={LABEL}={label}",
            *accounting_flags(),
            f"--volume={root}:/srv/repo:ro",
            ensure_image(),
            "python3",
            "-m",
            "http.server",
            str(PORT),
            "--directory",
            "/srv/repo",
        )
    return url(address)


def stop(container: str) -> None:
    docker("rm", "--force", container, check=False)


def vars_for(base: str, index: dict) -> dict:
    """Role variables that point every download at the stand-in repository at ``base``."""
    return {
        "nvidia_driver_repo_url": f"{base}/apt/",
        "nvidia_driver_repo_key_url": f"{base}/keys/corectl-standin.asc",
        # Grafana's repository has suites and components; the stand-in one is flat
        "monitoring_grafana_repo_url": f"{base}/apt/",
        "monitoring_grafana_repo_suite": "/",
        "monitoring_grafana_repo_components": "",
        "monitoring_grafana_repo_key_url": f"{base}/keys/corectl-standin.asc",
        "dcgm_exporter_url": f"{base}/{index['dcgm_exporter']['path']}",
        "dcgm_exporter_checksum": f"sha256:{index['dcgm_exporter']['sha256']}",
        "enroot_release_url": f"{base}/enroot/v{{{{ enroot_version }}}}",
        # the stand-ins are verified like the real releases: by their sha256
        "enroot_checksums": {
            Path(p["path"]).name: f"sha256:{p['sha256']}" for p in index["packages"] if p["name"].startswith("enroot")
        },
        # the real pyxis release archive: the role's own pinned checksum verifies it
        "pyxis_source_url": f"{base}/pyxis/archive/refs/tags/v{{{{ pyxis_version }}}}.tar.gz",
    }


def lab_vars(container: str, network: str, address: str, label: str) -> dict:
    """Serve the repository for a lab and return the role variables that point at it."""
    base = serve(container, network, address, label)
    index = json.loads((build_dir() / "index.json").read_text())
    return vars_for(base, index)

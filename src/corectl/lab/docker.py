"""Thin, typed access to the Docker engine; installs and starts it when missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from corectl.errors import CorectlError

DOCKERD_LOG = Path("/var/log/corectl-dockerd.log")


# Every container and network a lab (or a test fixture) starts carries LABEL=<site or owner>.
LABEL = "corectl.lab"
# Set by the test stages (tests/stages.py, tests/cpuacct.py): the cgroup a stage's containers go
# below, so that the stage's CPU includes theirs, and the stage's name as a label.
CGROUP_PARENT_ENV = "CORECTL_CGROUP_PARENT"
STAGE_ENV = "CORECTL_STAGE"
STAGE_LABEL = "corectl.stage"


def accounting_flags() -> list[str]:
    """``docker run`` flags that put a container in the running test stage's accounts (none outside one)."""
    flags = []
    if parent := os.environ.get(CGROUP_PARENT_ENV):
        flags.append(f"--cgroup-parent={parent}")
    if stage := os.environ.get(STAGE_ENV):
        flags.append(f"--label={STAGE_LABEL}={stage}")
    return flags


def docker(*args: str, check: bool = True, input_bytes: bytes | None = None) -> str:
    """Run ``docker ARGS`` and return stdout; raise a one-line CorectlError on failure."""
    proc = subprocess.run(["docker", *args], input=input_bytes, capture_output=True, check=False)
    if check and proc.returncode != 0:
        # the last line that says what went wrong (the CLI ends some errors with "Run 'docker run --help' ...")
        lines = proc.stderr.decode(errors="replace").splitlines()
        err = [line for line in lines if line.strip() and "--help'" not in line]
        detail = err[-1] if err else f"exit {proc.returncode}"
        raise CorectlError(f"docker {args[0]} failed: {detail}")
    return proc.stdout.decode(errors="replace")


def engine_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    proc = subprocess.run(["docker", "info"], capture_output=True, check=False)
    return proc.returncode == 0


def ensure_engine(timeout: float = 90.0) -> None:
    """Make ``docker info`` answer: install docker.io and start dockerd when needed."""
    if engine_ready():
        return
    if shutil.which("dockerd") is None:
        if os.geteuid() != 0:
            raise CorectlError("the Docker engine is not installed; run as root or install docker.io")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "docker.io"]):
            proc = subprocess.run(cmd, env=env, capture_output=True, check=False)
            if proc.returncode != 0:
                raise CorectlError(f"installing docker.io failed: {' '.join(cmd)} exited {proc.returncode}")
    if os.geteuid() != 0:
        raise CorectlError("the Docker engine is not running and starting it needs root")
    with DOCKERD_LOG.open("ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_ready():
            return
        time.sleep(1)
    raise CorectlError(f"dockerd did not answer within {timeout:.0f}s; see {DOCKERD_LOG}")


def image_exists(tag: str) -> bool:
    return bool(docker("images", "-q", tag).strip())

"""Storage checks: every expected mount point mounted and writable (probed in a child, so a hung
file system cannot hang the checker)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from .core import CheckFailed, Node, Skip, _read, run, summarize


def mount_points() -> list[str]:
    points = []
    for line in _read(Path("/proc/self/mounts")).splitlines():
        fields = line.split()
        if len(fields) >= 2:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
    return points


WRITE_PROBE = (
    "import os,sys\n"
    "p=os.path.join(sys.argv[1],'.corectl-health-%d'%os.getpid())\n"
    "fd=os.open(p,os.O_WRONLY|os.O_CREAT|os.O_EXCL,0o600)\n"
    "os.write(fd,b'ok');os.fsync(fd);os.close(fd);os.unlink(p)\n"
)


def check_mounts(node: Node) -> str:
    config = node.config
    wanted = config["mounts"]
    if not wanted:
        raise Skip("no mounts declared")
    mounted = set(mount_points())
    problems = []
    for path in wanted:
        point = os.path.normpath(path)
        if point not in mounted:
            problems.append(f"{point} not mounted")
            continue
        # a write in a child process with a timeout: a hung network file system must not hang us
        try:
            probe = run([sys.executable, "-c", WRITE_PROBE, point], node.timeout)
        except CheckFailed:
            problems.append(f"{point} not answering (write timed out after {node.timeout:g} s)")
            continue
        if probe.rc != 0:
            lines = probe.stderr.strip().splitlines()
            problems.append(f"{point} not writable: {lines[-1] if lines else 'rc ' + str(probe.rc)}")
    if problems:
        raise CheckFailed(summarize(problems))
    return f"{', '.join(wanted)} mounted and writable"

"""Filters that hold a cluster to one Slurm release (playbooks/slurm-versions.yml).

SchedMD's rule (Slurm's upgrade guide): upgrade slurmdbd first, then slurmctld, then slurmd; a
daemon talks to others at most two major releases older than itself (three from 24.11 on), and a
slurmd is never newer than its slurmctld. corectl asks for more on top: a node new to the cluster
(no Slurm daemon installed yet) gets exactly the cluster's release, so that a second OS generation
cannot slip a second Slurm into the cluster by an add-node.
"""

from __future__ import annotations

import re

# Slurm's major releases in order (every six months from 23.11 on)
RELEASES = ("20.02", "20.11", "21.08", "22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11")


def policy_version(text: str) -> str:
    """Debian's ``24.11.5-2`` or ``22.05.8-4+deb12u3`` as ``24.11.5``; ``""`` for ``(none)``."""
    match = re.match(r"^(?:\d+:)?(\d+\.\d+(?:\.\d+)?)", text.strip())
    return match.group(1) if match else ""


def release(version: str) -> str:
    """``24.11.5`` -> ``24.11`` (Slurm's major release)."""
    return ".".join(version.split(".")[:2])


def _index(major: str) -> int:
    """A major release's place in the sequence (releases after the table: one every six months)."""
    if major in RELEASES:
        return RELEASES.index(major)
    year, month = (int(part) for part in major.split("."))
    last_year, last_month = (int(part) for part in RELEASES[-1].split("."))
    return len(RELEASES) - 1 + ((year - last_year) * 12 + month - last_month) // 6


def releases_apart(older: str, newer: str) -> int:
    return _index(release(newer)) - _index(release(older))


def may_skip(newer: str) -> int:
    """How many major releases a daemon of ``newer`` may be ahead of the oldest it still talks to."""
    return 3 if _index(release(newer)) >= _index("24.11") else 2


POLICY = re.compile(r"^(\S+):\n\s+Installed: (\S+)\n\s+Candidate: (\S+)", re.MULTILINE)


def policy_versions(policy: str) -> dict[str, tuple[str, str]]:
    """``apt-cache policy PKG...``'s answer: package -> (installed, candidate), ``""`` for none. Line ends
    of a terminal (raw over SSH with a tty: CR LF) read as plain ones."""
    text = policy.replace("\r\n", "\n")
    return {m.group(1): (policy_version(m.group(2)), policy_version(m.group(3))) for m in POLICY.finditer(text)}


def slurm_version_problems(reads: list[dict], controller: str, controller_policy: str) -> list[str]:
    """``reads``: one entry per node of the run, {host, daemons, policy} (the Slurm daemons it runs or will
    run, ``apt-cache policy`` of their packages); ``controller``'s policy of slurmctld. The problems, one
    line each naming the nodes and their versions."""
    installed, candidate = policy_versions(controller_policy).get("slurmctld", ("", ""))
    ctld = installed or candidate
    if not ctld:
        return [f"{controller}: no slurmctld installed and none offered by its repositories"]
    theirs = f"slurmctld {ctld} on {controller}"
    rule = (
        f"one Slurm release per cluster (SchedMD: upgrade slurmdbd, then slurmctld, then slurmd, "
        f"at most {may_skip(ctld)} releases apart)"
    )
    found: list[str] = []
    for read in reads:
        versions = policy_versions(read["policy"])
        for daemon in read["daemons"]:
            host = read["host"]
            if host == controller and daemon == "slurmctld":
                continue
            installed, candidate = versions.get(daemon, ("", ""))
            version = installed or candidate
            if not version:
                found.append(f"{host}: no {daemon} installed and none offered by its repositories ({theirs})")
            elif not installed and release(version) != release(ctld):
                found.append(f"{host} would install {daemon} {version}, but {controller} runs slurmctld {ctld}: {rule}")
            elif daemon == "slurmctld" and release(version) != release(ctld):
                found.append(f"{host} runs slurmctld {version}, but {controller} runs slurmctld {ctld}: {rule}")
            elif daemon == "slurmdbd" and releases_apart(version, ctld) > 0:
                found.append(f"{host} runs slurmdbd {version}, older than {theirs}: {rule}")
            elif daemon == "slurmdbd" and releases_apart(ctld, version) > may_skip(version):
                found.append(f"{host} runs slurmdbd {version}, too far ahead of {theirs}: {rule}")
            elif daemon != "slurmdbd" and releases_apart(ctld, version) > 0:
                found.append(f"{host} runs {daemon} {version}, newer than {theirs}: {rule}")
            elif daemon != "slurmdbd" and releases_apart(version, ctld) > may_skip(ctld):
                found.append(f"{host} runs {daemon} {version}, too far behind {theirs}: {rule}")
    return found


class FilterModule:
    def filters(self) -> dict:
        return {"slurm_version_problems": slurm_version_problems}

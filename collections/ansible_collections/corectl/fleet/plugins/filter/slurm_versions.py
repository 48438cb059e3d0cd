"""Filters that hold a cluster to one Slurm release (playbooks/slurm-versions.yml).

SchedMD's rule (Slurm's upgrade guide): upgrade slurmdbd first, then slurmctld, then slurmd; a
daemon talks to others at most two major releases older than itself (three from 24.11 on), and a
slurmd is never newer than its slurmctld. corectl asks for more on top: a node new to the cluster
(no Slurm daemon installed yet) gets exactly the cluster's release, so that a second OS generation
cannot slip a second Slurm into the cluster by an add-node.
"""

from __future__ import annotations

import re

from ansible_collections.corectl.fleet.plugins.module_utils.systemd_units import systemd_show

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


def policy_packages(policy: str) -> dict[str, tuple[str, str]]:
    """``apt-cache policy PKG...``'s answer: package -> (installed, candidate) as Debian writes them
    (``22.05.8-4+deb12u3``), ``""`` for ``(none)``. Line ends of a terminal (raw over SSH with a tty: CR LF) read
    as plain ones."""
    text = policy.replace("\r\n", "\n")
    found = {}
    for match in POLICY.finditer(text):
        installed, candidate = (v if policy_version(v) else "" for v in (match.group(2), match.group(3)))
        found[match.group(1)] = (installed, candidate)
    return found


def policy_versions(policy: str) -> dict[str, tuple[str, str]]:
    """``apt-cache policy PKG...``'s answer: package -> (installed, candidate) as Slurm's versions
    (``22.05.8``), ``""`` for none."""
    return {name: (policy_version(i), policy_version(c)) for name, (i, c) in policy_packages(policy).items()}


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


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


def stale_daemons(units: str, executables: str) -> list[str]:
    """The daemons that run an executable replaced since they started (an upgrade installed, not restarted yet).
    ``units``: ``systemctl show --timestamp=unix -p Id -p ActiveState -p ExecMainStartTimestamp UNIT...``;
    ``executables``: ``stat -L -c '%n %Z' /usr/sbin/DAEMON...`` (dpkg's rename sets the ctime)."""
    replaced = {}
    for line in executables.splitlines():
        path, _, ctime = line.rpartition(" ")
        if path and ctime.isdigit():
            replaced[path.rsplit("/", 1)[-1]] = int(ctime)
    stale = []
    for daemon, fields in _units(units).items():
        started = fields.get("ExecMainStartTimestamp", "").lstrip("@")
        if fields.get("ActiveState") == "active" and started.isdigit() and replaced.get(daemon, 0) > int(started):
            stale.append(daemon)
    return sorted(stale)


def active_daemons(units: str) -> list[str]:
    """The daemons that run, from the same ``systemctl show`` as stale_daemons reads."""
    return sorted(daemon for daemon, fields in _units(units).items() if fields.get("ActiveState") == "active")


def _units(units: str) -> dict[str, dict[str, str]]:
    """``systemctl show`` of several units: each unit's properties by its name (slurmd for slurmd.service)."""
    return {unit.removesuffix(".service"): fields for unit, fields in systemd_show(units).items()}


def slurm_upgrade_plan(reads: list[dict], controller: str) -> dict:
    """corectl upgrade slurm's plan. ``reads``: one entry per Slurm host, {host, daemons, policy} as for
    slurm_version_problems, and ``stale``: its daemons running a replaced executable (stale_daemons). The target
    is what the controller's repositories offer for slurmctld; every daemon goes to it, in SchedMD's order (the
    playbook's). Returns {target, version, problems, hosts} (target: Debian's version; version: Slurm's, which the
    daemons report). ``hosts`` maps each host with a package to upgrade or a daemon to restart to
    {daemon: [installed, target]} (Debian's versions: a Debian revision of the same release, a security fix, is an
    upgrade too); ``problems`` says, one line each, why the upgrade must not start (a node offered another
    version, a downgrade, a jump past SchedMD's rule)."""
    by_host = {read["host"]: read for read in reads}
    policy = policy_packages(by_host.get(controller, {}).get("policy", ""))
    target_deb = policy.get("slurmctld", ("", ""))[1]
    target = policy_version(target_deb)
    if not target:
        return {"target": "", "version": "", "problems": [f"{controller}: its repositories offer no slurmctld"],
                "hosts": {}}  # fmt: skip
    problems: list[str] = []
    hosts: dict[str, dict[str, list[str]]] = {}
    allowed = may_skip(target)
    for read in reads:
        host, versions = read["host"], policy_packages(read["policy"])
        for daemon in read["daemons"]:
            installed_deb, candidate_deb = versions.get(daemon, ("", ""))
            installed = policy_version(installed_deb)
            if not installed:
                problems.append(f"{host}: no {daemon} installed (corectl provision installs it)")
            elif candidate_deb != target_deb:
                problems.append(
                    f"{host}'s repositories offer {daemon} {candidate_deb or 'none'}, {controller}'s slurmctld "
                    f"{target_deb}: every Slurm host must be offered the same release"
                )
            elif version_key(target) < version_key(installed):
                problems.append(f"{host} runs {daemon} {installed}, newer than {target}: an upgrade never goes back")
            elif releases_apart(installed, target) > allowed:
                through = RELEASES[min(_index(release(installed)) + allowed, len(RELEASES) - 1)]
                problems.append(
                    f"{host} runs {daemon} {installed}: {target} is {releases_apart(installed, target)} major "
                    f"releases ahead, and SchedMD allows at most {allowed} in one step (slurmdbd, then slurmctld, "
                    f"then slurmd; their saved state and database are converted once); upgrade to {through} first"
                )
            elif installed_deb != target_deb or daemon in read.get("stale", []):  # (installed, not restarted)
                hosts.setdefault(host, {})[daemon] = [installed_deb, target_deb]
    return {"target": target_deb, "version": target, "problems": problems, "hosts": hosts if not problems else {}}


class FilterModule:
    def filters(self) -> dict:
        return {
            "slurm_version_problems": slurm_version_problems,
            "slurm_upgrade_plan": slurm_upgrade_plan,
            "slurm_stale_daemons": stale_daemons,
            "slurm_active_daemons": active_daemons,
        }

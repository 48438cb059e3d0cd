"""logs: one node's logs as the log host keeps them (role logs forwards every node's journal there over TCP). The
log host's corectl-logs reads them (playbooks/logs.yml), so a node that is down, or was power-cycled, still has
what it logged before."""

from __future__ import annotations

import re

from rich.console import Console

from corectl import ansible
from corectl.ansible import Returned, RunRequest
from corectl.errors import CorectlError
from corectl.site.context import Context

RETURNED = "corectl_logs"  # playbooks/logs.yml hands the reader's answer back under it
DURATION = re.compile(r"^(\d{1,6})([smhd])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_seconds(text: str) -> int:
    """'90s', '30m', '2h', '7d' in seconds."""
    match = DURATION.match(text)
    if not match:
        raise CorectlError(f"--since {text!r}: a number and a unit, s m h or d (e.g. 30m, 2h, 7d)", exit_code=2)
    return int(match.group(1)) * SECONDS[match.group(2)]


def logs(ctx: Context, console: Console, node: str, since: str | None, grep: str | None, lines: int) -> list[str]:
    extravars = {"corectl_logs_node": node, "corectl_logs_lines": lines, "corectl_logs_grep": grep or ""}
    if since is not None:
        extravars["corectl_logs_since"] = since_seconds(since)
    if grep:
        try:
            re.compile(grep)
        except re.error as exc:
            raise CorectlError(f"--grep {grep!r}: {exc}", exit_code=2) from None
    site, cluster = ctx.site, ctx.rendered()
    if cluster.config.logs is None:
        raise CorectlError(f"{site.cluster_file}: logs is not set (no node forwards its logs)", exit_code=2)
    if node not in {n.name for n in cluster.nodes}:
        raise CorectlError(f"{node} is not a node of {site.name}", exit_code=2)
    host = cluster.config.logs.host or cluster.with_role("slurm_controller")[0].name
    request = RunRequest.of(
        ctx, playbook="logs.yml", command=f"logs {node}", limit=host, extravars=extravars, secrets=False,
        fan_out=False,
    )  # fmt: skip
    read = Returned(RETURNED, lambda _event: None)
    ansible.run(request, read, cluster=cluster)
    res = read.by_host.get(host) or {}
    if res.get("rc") == 1:
        raise CorectlError(f"the log host {host} holds no logs of {node}")
    if res.get("rc") != 0:
        said = read.unreachable.get(host) or res.get("stderr") or res.get("msg") or "no result"
        raise CorectlError(f"reading {node}'s logs on {host} failed: {str(said).strip()}")
    return str(res.get("stdout") or "").splitlines()

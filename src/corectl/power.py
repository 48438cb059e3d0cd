"""Power through the nodes' BMCs: which nodes have one, why cutting them would hurt (running
jobs, service roles), the actions in parallel, and each action in the failure history."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from corectl import bmc, hostlist, secrets
from corectl.errors import CorectlError
from corectl.health import failures
from corectl.site import Site
from corectl.site.context import Context
from corectl.site.model import Cluster, Node
from corectl.slurm import read_slurm_status

PARALLEL_BMCS = 16  # BMC sessions at a time (BMCs answer slowly; the control host waits, not works)
ACTIONS = ("on", "off", "soft", "cycle")
DESTRUCTIVE = ("off", "soft", "cycle")


@dataclass(frozen=True)
class PowerResult:
    node: str
    ok: bool
    state: str  # what the BMC reports after the action ("on", "off", "?" when unknown)
    detail: str


def bmc_nodes(cluster: Cluster, expr: str) -> list[Node]:
    """The nodes ``expr`` names (a Slurm host list), each with a declared BMC."""
    try:
        names = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        raise CorectlError(f"NODE: {exc}", exit_code=2) from None
    known = {node.name: node for node in cluster.nodes}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise CorectlError(f"not nodes of this site: {hostlist.compress(unknown)}", exit_code=2)
    missing = [name for name in names if known[name].bmc is None]
    if missing:
        raise CorectlError(
            f"no bmc declared for {hostlist.compress(missing)} in cluster.yml (nodes[].bmc)", exit_code=2
        )
    return [known[name] for name in names]


def refusals(ctx: Context, nodes: list[Node]) -> list[str]:
    """Why powering ``nodes`` off would hurt: running jobs, or a node that is more than a compute node."""
    reasons = [
        f"{node.name} is {', '.join(r for r in node.roles if r != 'compute')}"
        for node in nodes
        if set(node.roles) - {"compute"}
    ]
    if any("compute" in node.roles for node in nodes):
        try:
            status = read_slurm_status(ctx)
        except CorectlError as exc:
            return [*reasons, f"running jobs unknown: {exc}"]
        for node in nodes:
            jobs = status.jobs_on(node.name)
            if jobs:
                reasons.append(f"{node.name} runs job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}")
    return reasons


def credentials(site: Site) -> bmc.Credentials:
    user, password = secrets.bmc_credentials(site)
    return bmc.Credentials(user, password)


def apply(
    site: Site,
    nodes: list[Node],
    action: str,
    creds: bmc.Credentials,
    timeout: float,
    record: Callable[[str, str, str, str], None] | None = None,
) -> list[PowerResult]:
    """Carry out ``action`` ("status" or a power action) on every node's BMC at once."""

    def one(node: Node) -> PowerResult:
        assert node.bmc is not None
        try:
            power = bmc.client(node.name, node.bmc, creds, site.directory)
            if action == "status":
                return PowerResult(node.name, True, power.state(), "")
            result = PowerResult(node.name, True, "", "done")
            for step in ("off", "on") if action == "cycle" else (action,):
                power.act(step)  # type: ignore[arg-type]
                want = bmc.TARGET[step]
                if not bmc.wait_for(power, want, timeout):
                    result = PowerResult(node.name, False, "?", f"{step}: still not {want} after {timeout:.0f}s")
                    break
                result = PowerResult(node.name, True, want, "done")
        except bmc.BmcError as exc:
            result = PowerResult(node.name, False, "?", str(exc).removeprefix(f"{node.name}: "))
        if record is not None:
            record(node.name, f"power {action}", "ok" if result.ok else "failed", result.detail)
        return result

    with ThreadPoolExecutor(max_workers=min(PARALLEL_BMCS, max(1, len(nodes)))) as pool:
        return list(pool.map(one, nodes))


def history_recorder(site: Site, warn: Callable[[str], None]) -> Callable[[str, str, str, str], None]:
    """Each power action into the failure history (a history that cannot be written: one warning)."""

    def record(node: str, action: str, outcome: str, detail: str) -> None:
        try:
            failures.record_action(site, node, action, outcome, detail, datetime.now(UTC))
        except failures.HistoryUnavailable as exc:
            warn(f"warning: {node}: {action} not recorded in the history: {exc}")

    return record

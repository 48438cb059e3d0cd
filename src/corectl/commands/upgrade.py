"""upgrade drivers, os and slurm: rolling upgrades, batch by batch, no job killed.

upgrade drivers: to group_vars' nvidia_driver_version (provision refuses to change a running driver, so this is
the only way a node gets a new one); a node with running jobs is drained and waited for.
upgrade os: the package updates the nodes' repositories offer, what corectl pins left out; a node that must
reboot is drained, rebooted once its jobs have ended, and returns only after its validation passes.

upgrade slurm: every Slurm host to the release the controller's repositories offer, in SchedMD's order
(playbooks/upgrade-slurm.yml), after a plan that refuses a jump past SchedMD's rule and a backup.

Drivers and os go in batches of at most ``--batch`` nodes out of service at once: held spares first (they run nothing),
then idle nodes (done while the busy ones finish their jobs), then busy ones, each group in name order. The
rollout stops at the first batch that fails, leaving the remaining nodes untouched; run again, it carries on
(a node done has nothing left to do).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console

from corectl import ansible, hostlist, secrets
from corectl.ansible import RunRequest, RunResult
from corectl.errors import CorectlError
from corectl.progress import LiveProgress, summary_table
from corectl.site.context import Context
from corectl.slurm import read_slurm_status


def rollout_order(nodes: list[str], busy: set[str], spares: set[str] = frozenset()) -> list[str]:
    """Held spares first, then idle nodes, then busy ones; each group in the order given."""
    first = [n for n in nodes if n in spares]
    return (
        first
        + [n for n in nodes if n not in busy and n not in spares]
        + [n for n in nodes if n in busy and n not in spares]
    )


def batches(nodes: list[str], size: int) -> list[list[str]]:
    return [nodes[i : i + size] for i in range(0, len(nodes), size)]


def chosen_nodes(site_name: str, candidates: list[str], kind: str, limit: str | None) -> list[str]:
    """The candidates ``--limit`` names (all without one); a name that is not a candidate is refused."""
    if limit:
        try:
            wanted = set(hostlist.expand(limit))
        except hostlist.HostlistError as exc:
            raise CorectlError(f"--limit: {exc}", exit_code=2) from None
        unknown = sorted(wanted - set(candidates))
        if unknown:
            raise CorectlError(f"not {kind} of site {site_name}: {', '.join(unknown)}", exit_code=2)
        candidates = [n for n in candidates if n in wanted]
    if not candidates:
        raise CorectlError(f"site {site_name} has no {kind}", exit_code=2)
    return candidates


def rollout(
    ctx: Context,
    console: Console,
    what: str,
    playbook: str,
    candidates: tuple[list[str], str],
    limit: str | None,
    batch: int,
    extravars: dict,
) -> list[RunResult]:
    """Run ``playbook`` in batches over the candidates (their names, and what they are, for the errors) that
    ``limit`` keeps: spares, idle, busy; stop at the first batch that fails. Bad input changes nothing."""
    if batch < 1:
        raise CorectlError("--batch must be at least 1", exit_code=2)
    nodes = chosen_nodes(ctx.site.name, candidates[0], candidates[1], limit)
    secrets.check(ctx.site)
    status = read_slurm_status(ctx)
    spares = {spare for pool in status.spares for spare in pool.spares}
    plan = batches(rollout_order(nodes, status.busy_nodes(), spares), batch)
    cluster = ctx.rendered()
    results: list[RunResult] = []
    for index, members in enumerate(plan, start=1):
        names = hostlist.compress(members)
        console.print(f"batch {index}/{len(plan)}: {names}", highlight=False)
        request = RunRequest.of(
            ctx, playbook=playbook, command=f"{what} {names}", limit=",".join(members), extravars=extravars
        )
        with LiveProgress(console, f"{what} {names}") as progress:
            result = ansible.run(request, progress, cluster=cluster)  # fanned out when the site has runners
        console.print(summary_table(result))
        results.append(result)
        if not result.ok:
            left = [n for later in plan[index:] for n in later]
            rest = f"; not started: {hostlist.compress(left)}" if left else ""
            failed = ", ".join(result.failed_hosts) or result.status  # what Ansible said is in the table above
            raise CorectlError(f"{what} stopped at batch {index} ({failed}){rest}")
    return results


def upgrade_drivers(
    ctx: Context, console: Console, *, batch: int, timeout: int, limit: str | None = None
) -> list[RunResult]:
    gpus = [n.name for n in ctx.rendered().with_gpus()]
    extravars = {"corectl_upgrade_timeout": timeout}
    return rollout(ctx, console, "upgrade drivers", "upgrade-drivers.yml", (gpus, "GPU nodes"), limit, batch, extravars)


def upgrade_os(
    ctx: Context, console: Console, *, batch: int, timeout: int, security_only: bool, limit: str | None = None
) -> list[RunResult]:
    computes = [n.name for n in ctx.rendered().with_role("compute")]
    extravars = {"corectl_upgrade_timeout": timeout, "corectl_upgrade_security_only": security_only}
    return rollout(ctx, console, "upgrade os", "upgrade-os.yml", (computes, "compute nodes"), limit, batch, extravars)


@dataclass(frozen=True)
class SlurmPlan:
    target: str  # Debian's version of the release every daemon goes to
    hosts: dict[str, dict[str, list[str]]]  # host -> daemon -> [installed, target]: what is to upgrade

    def line(self) -> str:
        by_daemon: dict[str, list[str]] = {}
        for host, daemons in self.hosts.items():
            for daemon in daemons:
                by_daemon.setdefault(daemon, []).append(host)
        order = ("slurmdbd", "slurmctld", "slurmd", "slurm-client")
        parts = [f"{d} on {hostlist.compress(sorted(by_daemon[d]))}" for d in order if d in by_daemon]
        # (a daemon installed at the target but not restarted yet: an interrupted run)
        before = sorted({v[0] for daemons in self.hosts.values() for v in daemons.values() if v[0] != self.target})
        return f"{', '.join(before) or 'restart'} -> {self.target}: {', '.join(parts)}"


PLAN_KEY = "slurm_upgrade"  # playbooks/upgrade-slurm-check.yml hands its plan back under it


def slurm_plan(ctx: Context, console: Console) -> SlurmPlan:
    """What upgrade slurm would do (a read of every Slurm host; nothing changes). A plan against SchedMD's rule
    is refused with the rule."""
    request = RunRequest.of(ctx, playbook="upgrade-slurm-check.yml", command="upgrade slurm (plan)", fan_out=False)
    with LiveProgress(console, "upgrade slurm: plan") as progress:
        result = ansible.run(request, progress)
    plans = [host[PLAN_KEY] for host in result.recorded.values() if PLAN_KEY in host]
    if plans and plans[0]["problems"]:
        raise CorectlError(f"upgrade slurm refused: {'; '.join(plans[0]['problems'])}")
    if not result.ok or not plans:
        console.print(summary_table(result))
        raise CorectlError(f"upgrade slurm: the plan failed ({', '.join(result.failed_hosts) or result.status})")
    return SlurmPlan(plans[0]["target"], plans[0]["hosts"])


def upgrade_slurm(
    ctx: Context, console: Console, *, batch: int, backup: Callable[[], object]
) -> tuple[SlurmPlan, RunResult | None]:
    """The plan; when it has something to upgrade, ``backup()`` and then the upgrade, slurmdbd, slurmctld, then
    slurmd ``batch`` nodes at a time. Bad input and a refused plan change nothing."""
    if batch < 1:
        raise CorectlError("--batch must be at least 1", exit_code=2)
    secrets.check(ctx.site)
    plan = slurm_plan(ctx, console)
    if not plan.hosts:
        return plan, None
    console.print(f"upgrade slurm: {plan.line()}", highlight=False)
    backup()
    request = RunRequest.of(
        ctx, playbook="upgrade-slurm.yml", command=f"upgrade slurm {plan.target}", fan_out=False,
        extravars={"corectl_upgrade_batch": batch},
    )  # fmt: skip
    with LiveProgress(console, f"upgrade slurm to {plan.target}") as progress:
        result = ansible.run(request, progress)
    console.print(summary_table(result))
    if not result.ok:
        raise CorectlError(f"upgrade slurm stopped ({', '.join(result.failed_hosts) or result.status})")
    return plan, result

"""heal: walk the nodes the health checks drained up their remediation ladders (corectl.health.heal)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corectl import ansible, hostlist
from corectl.ansible import RunRequest
from corectl.drain_reason import DrainReason, Source
from corectl.errors import CorectlError
from corectl.health import heal as rules
from corectl.health.failures import Action, keep_slurm_events, last_action
from corectl.health.report import health
from corectl.node_state import NodeState
from corectl.power import apply as power_apply
from corectl.power import credentials, history_recorder
from corectl.progress import LiveProgress
from corectl.site import groupvars
from corectl.site.context import Context
from corectl.site.model_services import Validation
from corectl.slurm import compute_names, read_slurm_status, state_run

POWER_TIMEOUT_S = 120  # for the BMC to report off, then on


@dataclass(frozen=True)
class Outcome:
    node: str
    result: str  # resumed, needs service, no remedy, skipped, waiting, failed
    detail: str

    @property
    def ok(self) -> bool:
        return self.result in ("resumed", "skipped", "waiting")


class Healer:
    """One `corectl heal`: the site, its rules, and what happened to each node."""

    def __init__(self, ctx: Context, console: Console, warn: Callable[[str], None]) -> None:
        site, cluster = ctx.site, ctx.rendered()
        values = groupvars.all_vars(site)
        self.ctx, self.site, self.cluster, self.console = ctx, site, cluster, console
        self.ladders = rules.ladders(values)
        self.window = rules.window_hours(values)
        self.record = history_recorder(site, warn)
        self.warn = warn
        self.outcomes: list[Outcome] = []
        validation = cluster.config.health.validation
        # the validation of item 4 (cluster.yml health.validation), or its defaults where the site has none
        self.validation_level = validation.dcgm_level if validation else Validation().dcgm_level
        self.validation_words = f"dcgmi diag -r {self.validation_level}, nccl"

    # ------------------------------------------------------------------ choosing nodes

    def drained(self, named: list[str] | None) -> list[str]:
        """Nodes drained by the health checks with no job left (named ones that are not: said why)."""
        computes = [n.name for n in self.cluster.nodes if "compute" in n.roles]
        status = read_slurm_status(self.ctx)
        keep_slurm_events(self.site, status.events, self.warn)
        chosen = []
        for node in named or computes:
            state, reason = status.states.get(node, NodeState("unknown"))
            if rules.drained_check(reason) is None:
                if named:
                    why = f"{state}, reason: {reason}" if reason else state
                    self.outcomes.append(Outcome(node, "skipped", f"not drained by the health checks ({why})"))
                continue
            jobs = status.jobs_on(node)
            if jobs:
                self.outcomes.append(Outcome(node, "waiting", f"jobs still running: {', '.join(jobs)}"))
                continue
            chosen.append(node)
        return chosen

    def last_healed(self, node: str, check: str) -> Action | None:
        """When a heal last resumed ``node`` after ``check`` failed (resumes record "<check>: ...")."""
        return last_action(self.site, node, rules.HEALED, rules.OK, detail_prefix=f"{check}: ")

    # ------------------------------------------------------------------ steps

    def checks(self, nodes: list[str], validation: bool = False) -> dict[str, str | None]:
        """node -> its first failing check now (None: the checks pass). ``validation``: after a hardware-class
        remedy, the checks with dcgmi diag at the validation level and the nccl check (the node is drained
        and idle: nothing else needs its GPUs)."""
        if not nodes:
            return {}
        level = self.validation_level if validation else None
        reports = health(self.ctx, self.console, limit=",".join(nodes), level=level, validation=validation).nodes
        return {node: rules.first_failed(reports[node]) if node in reports else "reachable" for node in nodes}

    def playbook_step(self, step: str, nodes: list[str], **extravars: str) -> dict[str, str]:
        """Run one step of playbooks/heal.yml; node -> why it failed."""
        request = RunRequest.of(
            self.ctx,
            playbook="heal.yml",
            command=f"heal {step} {hostlist.compress(nodes)}",
            limit=",".join(nodes),
            extravars={"corectl_heal_step": step, **extravars},
            secrets=False,
            fan_out=False,  # the steps run from here, node by node
        )
        with LiveProgress(self.console, f"heal {step}") as progress:
            result = ansible.run(request, progress)
        failed = {host: result.messages.get(host, "failed") for host in result.failed_hosts}
        if not result.ok and not failed:
            failed = {node: f"heal.yml {result.status}" for node in nodes}
        return failed

    def power_cycle(self, nodes: list[str]) -> dict[str, str]:
        by_name = {n.name: n for n in self.cluster.nodes}
        failed = {node: "no bmc declared in cluster.yml" for node in nodes if by_name[node].bmc is None}
        with_bmc = [by_name[node] for node in nodes if node not in failed]
        if with_bmc:
            try:
                creds = credentials(self.site)
            except CorectlError as exc:
                return {**failed, **{n.name: str(exc) for n in with_bmc}}
            for result in power_apply(self.site, with_bmc, "cycle", creds, POWER_TIMEOUT_S):
                if not result.ok:
                    failed[result.node] = result.detail
            back = [n.name for n in with_bmc if n.name not in failed]
            if back:
                failed.update(self.playbook_step("wait-for-boot", back))
        return failed

    def keep_evidence(self, step: str, nodes: list[str]) -> None:
        """Before ``step`` erases it: each node's kernel log and nvidia-bug-report.sh's report (where the
        driver has it), kept in the site's .evidence/<time>/<node>/ and named in its history."""
        folder = self.site.evidence_dir / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        failed = self.playbook_step("evidence", nodes, corectl_heal_evidence_dir=str(folder))
        for node in nodes:
            kept = sorted(path.name for path in (folder / node).glob("*"))
            if node in failed or not kept:
                self.record(node, "heal: evidence", "failed", f"before {step}: {failed.get(node, 'nothing kept')}")
            else:
                self.record(node, "heal: evidence", rules.OK, f"before {step}: {folder / node} ({', '.join(kept)})")

    def run_step(self, step: str, nodes: list[str]) -> None:
        if step in rules.ERASING:
            self.keep_evidence(step, nodes)
        failed = self.power_cycle(nodes) if step == "power-cycle" else self.playbook_step(step, nodes)
        for node in nodes:
            self.record(node, f"heal: {step}", "failed" if node in failed else rules.OK, failed.get(node, ""))

    # ------------------------------------------------------------------ endings

    def resume(self, passed: dict[str, str]) -> None:
        if not passed:
            return
        result = state_run(self.ctx, self.console, sorted(passed), "resume", only_source=Source.HEALTH)
        for node, detail in sorted(passed.items()):
            if result.ok:
                self.record(node, rules.HEALED, rules.OK, detail)
                self.outcomes.append(Outcome(node, "resumed", detail))
            else:
                self.outcomes.append(Outcome(node, "failed", f"{detail}, but the resume failed: {result.status}"))

    def needs_service(self, cases: dict[str, tuple[str, str]]) -> None:
        """node -> (check, why): drained for hardware service, one drain per check."""
        by_check: dict[str, list[str]] = {}
        for node, (check, _) in cases.items():
            by_check.setdefault(check, []).append(node)
        for check, nodes in sorted(by_check.items()):
            reason = str(DrainReason.service(check))
            result = state_run(self.ctx, self.console, sorted(nodes), "drain", reason)
            for node in sorted(nodes):
                why = cases[node][1]
                self.record(node, "heal: needs hardware service", "drained" if result.ok else "failed", why)
                self.outcomes.append(Outcome(node, "needs service" if result.ok else "failed", f"{check}: {why}"))

    # ------------------------------------------------------------------ the whole run

    def run(self, named: list[str] | None) -> list[Outcome]:
        nodes = self.drained(named)
        if not nodes:
            return self.outcomes
        now = datetime.now(UTC)
        cases: list[rules.Case] = []
        passed: dict[str, str] = {}
        service: dict[str, tuple[str, str]] = {}
        for node, check in self.checks(nodes).items():
            if check is None:
                passed[node] = "the checks pass again"
            elif rules.healed_recently(self.last_healed(node, check), now, self.window):
                service[node] = (check, f"failed again within {self.window}h of being healed of it")
            elif not self.ladders.get(check):
                self.record(node, "heal: no remedy", "left drained", check)
                self.outcomes.append(Outcome(node, "no remedy", f"{check}: no ladder in {rules.LADDERS_VAR}"))
            else:
                cases.append(rules.Case(node, check, list(self.ladders[check])))
        self.resume(passed)
        while cases:
            by_step: dict[str, list[rules.Case]] = {}
            for case in cases:
                by_step.setdefault(case.advance(), []).append(case)
            for step, group in by_step.items():
                self.run_step(step, [case.node for case in group])
            # a reboot, power cycle or GPU reset is a hardware-class remedy: the node is validated before it is resumed
            erased = [case.node for case in cases if case.tried[-1] in rules.ERASING]
            now_failing = self.checks([case.node for case in cases if case.node not in erased])
            now_failing.update(self.checks(erased, validation=True))
            passed, still = {}, []
            for case in cases:
                check = now_failing[case.node]
                if check is None:
                    what = (
                        f"the checks and validation ({self.validation_words})" if case.node in erased else "the checks"
                    )
                    passed[case.node] = f"{case.check}: {what} pass after {case.tried[-1]}"
                elif not case.steps:
                    service[case.node] = (case.check, f"still failing ({check}) after {', '.join(case.tried)}")
                else:
                    still.append(case)
            self.resume(passed)
            cases = still
        self.needs_service(service)
        return self.outcomes


def heal(ctx: Context, console: Console, expr: str | None, warn: Callable[[str], None]) -> list[Outcome]:
    healer = Healer(ctx, console, warn)  # cluster.yml validated and the inventory rendered once, for every round
    return healer.run(compute_names(ctx, expr, "NODES") if expr else None)


def outcome_table(outcomes: list[Outcome]) -> Table | Text:
    if not outcomes:
        return Text("heal: no node drained by the health checks")
    table = Table(title="heal", title_justify="left", padding=(0, 1))
    table.add_column("node", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail")
    for o in sorted(outcomes, key=lambda o: o.node):
        table.add_row(o.node, Text(o.result, style="" if o.ok else "bold red"), o.detail)
    return table

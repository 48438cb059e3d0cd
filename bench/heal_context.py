"""What heal spends on cluster.yml on a large site: one command context (issue 46) against a validation and
render per run, as before it.

A 1,201-node site (bench/render_scale.py's generator), one node drained by the health checks for an Xid whose
ladder (reboot, power cycle) fixes it at the second step. heal's real code runs, corectl.ansible.run answered in
this process (no node, no Ansible): the health runs answer each node's report as the checker would, the Slurm
read answers the drain, the steps succeed. The baseline, in the same process, is a context whose every run
health run validates and renders the site again, which is what the code before it did (heal once, then every
health run of its ladder: corectl.health.report.health called render_site).
Prints, best of REPEAT each: validations, seconds, and the ratio.

    .venv/bin/python bench/heal_context.py
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from render_scale import site_with

from corectl import ansible
from corectl.ansible.events import HostStats, RunRequest, RunResult
from corectl.commands import heal as heal_cmd
from corectl.health.report import RETURNED, HealthResult, health
from corectl.site import Site, context
from corectl.site.context import Context
from corectl.site.model import Cluster

ROOT = Path(__file__).resolve().parents[1]
DGX = 1200
REPEAT = 3
NODE = "dgx0001"
REASON = "corectl-health: xid: Xid 79 on GPU 0"


class Rig:
    """corectl.ansible.run for heal: the node's fault ends with its second step (a power cycle's wait)."""

    def __init__(self) -> None:
        self.fixed = False
        self.runs = 0

    def run(self, request: RunRequest, sink: Any = None, *, cluster: Cluster | None = None) -> RunResult:
        self.runs += 1
        extravars, hosts = request.extravars, (request.limit or NODE).split(",")
        if request.playbook == "slurm-status.yml":
            state = "idle" if self.fixed else "drain"
            data = {"nodes": [f"{NODE}|{state}|{'' if self.fixed else REASON}"], "jobs": [], "events": []}
            Path(extravars["corectl_status_out"]).write_text(json.dumps(data))
        if request.playbook == "heal.yml" and extravars.get("corectl_heal_step") == "wait-for-boot":
            self.fixed = True
        if request.playbook == "health.yml":
            for host in hosts:
                checks = [{"name": "clock", "status": "pass", "message": "ok"}]
                if not self.fixed:
                    checks.insert(0, {"name": "xid", "status": "fail", "message": "Xid 79 on GPU 0"})
                report = {"node": host, "ok": self.fixed, "checks": checks}
                res = {"rc": 0 if self.fixed else 1, "stdout": json.dumps(report)}
                returned = {RETURNED: {host: res}}  # what playbooks/health.yml hands back (set_stats)
                sink({"event": "playbook_on_stats", "event_data": {"artifact_data": returned}})
        stats = {host: HostStats(ok=1) for host in hosts}
        return RunResult("successful", 0, stats, Path(tempfile.gettempdir()), 0.0)


def one_heal(site: Site, before: bool) -> tuple[float, int, list[str]]:
    rig = Rig()
    validations = 0
    real = context.validate

    def counted(target: Site) -> Cluster:
        nonlocal validations
        validations += 1
        return real(target)

    def every_time(ctx: Context, *args: Any, **kwargs: Any) -> HealthResult:
        ctx.reload()  # before: corectl.health.report.health began with render_site
        return health(ctx, *args, **kwargs)

    context.validate, ansible.run = counted, rig.run  # type: ignore[assignment]
    heal_cmd.health = every_time if before else health  # type: ignore[assignment]
    heal_cmd.Healer.power_cycle = lambda self, nodes: self.playbook_step("wait-for-boot", nodes)  # type: ignore[method-assign]
    site.history_db.unlink(missing_ok=True)
    try:
        started = time.perf_counter()
        outcomes = heal_cmd.heal(Context(site), Console(file=io.StringIO()), None, warn=print)
        spent = time.perf_counter() - started
    finally:
        context.validate, heal_cmd.health = real, health
    return spent, validations, [f"{o.node} {o.result}" for o in outcomes]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="corectl-bench-heal-") as tmp:
        directory = site_with(DGX, Path(tmp))
        site = Site(root=ROOT, directory=directory)
        results = {}
        for name, before in (("before (a render per health run)", True), ("context (one render)", False)):
            best = min((one_heal(site, before) for _ in range(REPEAT)), key=lambda r: r[0])
            results[name] = best
        print(f"heal of one node (Xid: reboot, then power cycle) on a {DGX + 1}-node site, best of {REPEAT}:")
        for name, (spent, validations, outcomes) in results.items():
            print(f"  {name:33} {validations:2} validations+renders  {spent:6.2f} s  {', '.join(outcomes)}")
        (before, *_), (now, *_) = results.values()
        print(f"  ratio context/before: {now / before:.2f}")


if __name__ == "__main__":
    main()

"""Node health reports: run corectl-health-check on compute nodes (playbooks/health.yml), each
node's report and verdict (kept for `corectl status` and the failure history), and their views
(summary, node x check matrix, JSON)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from corectl import ansible
from corectl.ansible import Returned, RunRequest, RunResult
from corectl.errors import CorectlError
from corectl.health import failures
from corectl.progress import LiveProgress, summary_table
from corectl.site import Site
from corectl.site.context import Context
from corectl.words import counted

# The checker's order (roles/node_health/files/corectl-health-check): most specific first.
CHECK_ORDER = (
    "reachable",
    "checker",
    "driver-version",
    "gpu-count",
    "fm-version",
    "fabricmanager",
    "fabric",
    "persistence",
    "ecc",
    "nvlink",
    "temperature",
    "throttle",
    "pcie",
    "xid",
    "aer",
    "edac",
    "ib",
    "ib-errors",
    "gpudirect",
    "mounts",
    "nvme",
    "services",
    "clock",
    "dcgm-health",
    "dcgm-diag",
    "nccl",  # only when named: burn-in and validation jobs
    "nccl-pair",  # only when named: validation's pairwise round
    "ib-pair",
)
STATUSES = ("pass", "fail", "skip")
FAILED_VERDICT = "FAIL"  # how last_verdicts() starts a failed node's verdict
MESSAGE_LIMIT = 160  # characters of a check's message in the default output (--json and --wide: all)

Report = dict[str, Any]  # {"node", "ok", "checks": [{"name", "status", "message"}]}


@dataclass
class HealthResult:
    """Every node's report (failed and unreachable nodes included) and the Ansible run behind it."""

    nodes: dict[str, Report]
    run: RunResult | None = None

    @property
    def ok(self) -> bool:
        return bool(self.nodes) and all(report["ok"] for report in self.nodes.values())

    @property
    def failed_nodes(self) -> list[str]:
        return sorted(name for name, report in self.nodes.items() if not report["ok"])


# --------------------------------------------------------------------------- pure functions (unit-tested)


def failure(node: str, check: str, message: str) -> Report:
    return {"node": node, "ok": False, "checks": [{"name": check, "status": "fail", "message": message}]}


def normalize(node: str, data: Any) -> Report:
    """A node's checker output made safe to show: known statuses, ok recomputed from the checks."""
    if not isinstance(data, dict) or not isinstance(data.get("checks"), list):
        return failure(node, "checker", "unreadable result (no checks list)")
    checks = []
    for item in data["checks"]:
        if not isinstance(item, dict) or not item.get("name"):
            continue
        status = str(item.get("status", "fail"))
        checks.append(
            {
                "name": str(item["name"]),
                "status": status if status in STATUSES else "fail",
                "message": " ".join(str(item.get("message", "")).split()),
            }
        )
    if not checks:
        return failure(node, "checker", "the checker reported no checks")
    ok = all(c["status"] != "fail" for c in checks)
    return {"node": node, "ok": ok, "checks": checks}


RETURNED = "corectl_health"  # playbooks/health.yml hands each node's checker result back under it
CHECKER = "/usr/local/sbin/corectl-health-check"


def report_from_result(node: str, res: dict[str, Any]) -> Report:
    """A node's report from its check task's result, as the run's event stream carries it (from
    this host or a runner host alike): the checker's JSON, or why there is none."""
    stdout, rc = str(res.get("stdout") or ""), res.get("rc")
    if rc in (0, 1) and stdout.startswith("{"):
        try:
            return normalize(node, json.loads(stdout))
        except ValueError as exc:
            return failure(node, "checker", f"unreadable result: {exc}")
    cmd = res.get("cmd")
    words = cmd if isinstance(cmd, list) else str(cmd or "").split()
    program = str(words[0]) if words else CHECKER
    stderr, msg = str(res.get("stderr") or "").strip(), str(res.get("msg") or "")
    if msg.startswith("Error executing command") and not stderr:
        return failure(
            node, "checker", f"cannot execute {program} (not installed? run: corectl provision --tags health)"
        )
    detail = (stderr.splitlines()[-1] if stderr else "") or msg or "no output"
    return failure(node, "checker", f"{Path(program).name} failed (rc {'?' if rc is None else rc}): {detail}")


def collect(
    reports: dict[str, Report],
    hosts: dict[str, Any],
    unreachable: dict[str, str] | None = None,
) -> dict[str, Report]:
    """Merge the files with the run's per-host stats: a node without a result failed 'reachable'."""
    unreachable = unreachable or {}
    merged = dict(reports)
    for host, stats in hosts.items():
        if host in merged:
            continue
        if getattr(stats, "unreachable", 0) or host in unreachable:
            message = unreachable.get(host) or "unreachable over SSH"
        else:
            message = "no result (the health play failed on this node)"
        merged[host] = failure(host, "reachable", message)
    for host, message in unreachable.items():
        merged.setdefault(host, failure(host, "reachable", message))
    return dict(sorted(merged.items()))


def check_columns(reports: dict[str, Report]) -> tuple[list[str], list[str]]:
    """(checks shown as columns in checker order, checks skipped on every node)."""
    seen: dict[str, set[str]] = {}
    for report in reports.values():
        for check in report["checks"]:
            seen.setdefault(check["name"], set()).add(check["status"])
    ordered = sorted(seen, key=lambda n: (CHECK_ORDER.index(n) if n in CHECK_ORDER else len(CHECK_ORDER), n))
    columns = [name for name in ordered if seen[name] != {"skip"}]
    skipped = [name for name in ordered if seen[name] == {"skip"}]
    return columns, skipped


def health_json(reports: dict[str, Report]) -> dict[str, Any]:
    return {"nodes": reports, "ok": bool(reports) and all(r["ok"] for r in reports.values())}


def summary_line(reports: dict[str, Report]) -> str:
    """How many nodes were checked, passed and failed."""
    failed = sum(1 for r in reports.values() if not r["ok"])
    return f"health: {counted(len(reports), 'node')} checked, {len(reports) - failed:,} passed, {failed:,} failed"


def health_table(reports: dict[str, Report]) -> tuple[Table, list[str]]:
    """The node x check table (failures red, numbered) and the footnotes with their messages."""
    columns, skipped = check_columns(reports)
    table = Table(title=summary_line(reports), title_justify="left", padding=(0, 1))
    table.add_column("node", no_wrap=True)
    for name in columns:
        table.add_column(name, justify="center", no_wrap=True)
    notes: list[str] = []
    for node, report in reports.items():
        by_name = {c["name"]: c for c in report["checks"]}
        cells: list[Text] = [Text(node, style="" if report["ok"] else "bold red")]
        for name in columns:
            check = by_name.get(name)
            if check is None:
                cells.append(Text(""))
            elif check["status"] == "pass":
                cells.append(Text("ok", style="green"))
            elif check["status"] == "skip":
                cells.append(Text("-", style="dim"))
            else:
                notes.append(f"[{len(notes) + 1}] {node} {name}: {check['message']}")
                cells.append(Text(f"FAIL [{len(notes)}]", style="bold red"))
        table.add_row(*cells)
    if skipped:
        notes.append(f"skipped on every node: {', '.join(skipped)}")
    return table, notes


def shorten(message: str, limit: int = MESSAGE_LIMIT) -> str:
    return message if len(message) <= limit else message[: limit - 1].rstrip() + "…"


def failed_checks(report: Report) -> Text:
    """``xid: Xid 79 on GPU 3; ecc: ...``: each failing check with its (shortened) message."""
    text = Text()
    for check in (c for c in report["checks"] if c["status"] == "fail"):
        if text:
            text.append("; ")
        text.append(f"{check['name']}:", style="bold")
        if check["message"]:
            text.append(f" {shorten(check['message'])}")
    return text


def failures_grid(reports: dict[str, Report]) -> Table:
    """One row per failing node: its name (never cut) and its failing checks (wrapped beside it)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for node, report in reports.items():
        if not report["ok"]:
            grid.add_row(Text(node, style="bold red"), failed_checks(report))
    return grid


def render_summary(reports: dict[str, Report]) -> Group:
    """The summary line, then only the failing nodes: short at 80 columns and at 1,000 nodes."""
    all_ok = all(r["ok"] for r in reports.values())
    summary = Text(summary_line(reports), style="bold" if all_ok else "bold red")
    _, skipped = check_columns(reports)
    if skipped:
        summary.append(f" (skipped: {', '.join(skipped)})", style="dim")
    return Group(summary) if all_ok else Group(summary, failures_grid(reports))


def render_matrix(reports: dict[str, Report]) -> Group:
    table, notes = health_table(reports)
    lines = [Text(note, style="red" if note.startswith("[") else "dim") for note in notes]
    return Group(table, *lines)


def render_report(reports: dict[str, Report], wide: bool = False) -> Group:
    """The summary with the failing nodes, or with ``wide`` the full node x check matrix."""
    return render_matrix(reports) if wide else render_summary(reports)


# --------------------------------------------------------------------------- the run


def health(
    ctx: Context,
    console: Console,
    *,
    limit: str | None = None,
    level: int | None = None,
    validation: bool = False,
) -> HealthResult:
    """Validate the site, run playbooks/health.yml, collect every compute node's report. ``validation``: the
    checks that take every GPU as well (nccl), for nodes no job can land on (drained, and idle)."""
    site, cluster = ctx.site, ctx.rendered()
    if not any("compute" in node.roles for node in cluster.nodes):
        raise CorectlError(f"site {site.name} has no compute nodes", exit_code=2)
    if level is not None and level not in (0, 1, 2, 3):
        raise CorectlError("--level must be 0 (off), 1, 2 or 3", exit_code=2)
    extravars: dict[str, object] = {} if level is None else {"corectl_health_level": level}
    if validation:
        extravars["corectl_health_validation"] = True
    request = RunRequest.of(
        ctx,
        playbook="health.yml",
        command="health" + (f" --level {level}" if level is not None else "") + (" --validation" if validation else ""),
        limit=limit or "compute",  # the play's hosts: a fanned-out run then has no shard of service nodes
        extravars=extravars,
        secrets=False,
    )
    with LiveProgress(console, f"health {site.name}") as progress:
        checks = Returned(RETURNED, progress)
        run = ansible.run(request, checks, cluster=cluster)
    found = {host: report_from_result(host, res) for host, res in checks.by_host.items()}
    reports = collect(found, run.hosts, checks.unreachable)
    if not reports:
        if run.status == "canceled":
            raise CorectlError("health canceled", exit_code=130)
        tail = run.output_tail(3)
        detail = tail[-1] if tail else "no compute node matched"
        raise CorectlError(f"health: no node reported ({run.status}): {detail}", exit_code=2 if run.ok else 1)
    if not run.ok and not run.failed_hosts:
        console.print(summary_table(run))
    remember(site, reports, run_id=run.artifact_dir.name)
    return HealthResult(reports, run)


def warn_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def remember(
    site: Site, reports: dict[str, Report], run_id: str | None = None, warn: Callable[[str], None] = warn_stderr
) -> None:
    """Every verdict into the site's store (`corectl status` shows each node's newest; the failure history keeps
    them all); a store that cannot be written: ``warn``."""
    try:
        failures.record_verdicts(site, reports, datetime.now(UTC), run_id)
    except failures.StoreUnavailable as exc:
        warn(f"warning: failure history not recorded: {exc}")


def last_verdicts(site: Site) -> dict[str, str]:
    """node -> "ok <time>" / "FAIL <checks> <time>" from its last health run."""
    shown = {}
    for node, verdict in failures.last_verdicts(site).items():
        at = verdict.at.replace("T", " ")
        checks = ",".join(check.name for check in verdict.failed)
        shown[node] = f"ok {at}" if verdict.ok else f"{FAILED_VERDICT} {checks} {at}"
    return shown


def verdict_failed(verdict: str | None) -> bool:
    """Whether a verdict from last_verdicts() is a failure (None: never checked)."""
    return verdict is not None and verdict.startswith(FAILED_VERDICT)

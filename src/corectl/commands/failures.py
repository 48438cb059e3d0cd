"""history NODE, rma and report: a node's verdicts, actions and drains, the nodes to send back, and the
reliability figures of a period (corectl.health.failures, corectl.health.reliability).

Both first copy the drains and downs Slurm's accounting recorded (whoever made them: Slurm's health
program, heal, an operator, an upgrade) from the controller into the history; a controller that
cannot be read is warned about, and the history is shown as kept. The repeat-offender rule comes
from group_vars (``corectl_repeat_offender_failures`` failures in ``corectl_repeat_offender_days``
days; group_vars/all/health.yml, a site overrides it in its own group_vars); ``corectl rma
--failures/--days`` override it for one report. A failure is a failing health run or a failure
drain, each failure counted once (corectl.health.drains.failure_count); planned drains count nowhere.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import yaml
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corectl.errors import CorectlError
from corectl.health import failures
from corectl.health.failures import Action, Drain, Entry, Offenders, RmaCase, Verdict, rule, thresholds
from corectl.health.reliability import Figures, Reliability, reliability
from corectl.health.report import CHECK_ORDER, failed_checks
from corectl.health.stamps import parse_stamp
from corectl.site import Site, groupvars, require_cluster_file
from corectl.site.inventory import render_site
from corectl.site.loader import load_cluster
from corectl.slurm import read_slurm_status
from corectl.words import counted

Warn = Callable[[str], None]


def sync_drains(site: Site, warn: Warn) -> None:
    """The drains and downs Slurm's accounting recorded, copied into the history (read on the
    controller); a controller that cannot be read: ``warn``, and the history as kept."""
    try:
        render_site(site, check_only=False)
        events = read_slurm_status(site).events
    except CorectlError as exc:
        warn(f"warning: Slurm's drains not read, the history is shown as kept: {exc}")
        return
    failures.keep_slurm_events(site, events, warn)


def shown_time(at: str) -> str:
    """``2026-11-22 09:12:44Z``, as `corectl status` shows health times."""
    return at.replace("T", " ")


# --------------------------------------------------------------------------- rows (history and rma)


def _verdict_cells(verdict: Verdict) -> tuple[Text, Text]:
    if verdict.ok:
        return Text("ok", style="green"), Text("")
    checks = [{"name": c.name, "status": "fail", "message": c.message} for c in verdict.failed]
    return Text("FAIL", style="bold red"), failed_checks({"checks": checks})


def _action_cells(action: Action) -> tuple[Text, Text]:
    style = "green" if action.outcome == "ok" else "red" if action.outcome == "failed" else ""
    detail = Text(action.outcome, style=style)
    if action.detail:
        detail.append(f": {action.detail}")
    return Text(action.action, style="yellow"), detail


def _drain_cells(drain: Drain) -> tuple[Text, Text]:
    """``DRAIN  corectl-health: xid: ... (root(0), until 2026-11-26 01:02:03Z)``: a failure in red,
    planned work dim."""
    until = f"until {shown_time(drain.until)}" if drain.until else "still"
    state = next((word for word in ("DRAIN", "DOWN", "FAIL") if word in drain.state), drain.state or "DRAIN")
    kind = Text(state, style="bold red" if drain.failure else "dim")
    return kind, Text(f"{drain.reason} ({drain.user}, {until})", style="" if drain.failure else "dim")


def _cells(entry: Entry) -> tuple[Text, Text]:
    if isinstance(entry, Verdict):
        return _verdict_cells(entry)
    if isinstance(entry, Drain):
        return _drain_cells(entry)
    return _action_cells(entry)


def entries_grid(entries: list[Entry], indent: int = 0) -> Table:
    """One row per entry: its time and kind (never cut), then what it said (wrapped beside them)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column()
    for entry in entries:
        kind, detail = _cells(entry)
        grid.add_row(Text(" " * indent + shown_time(entry.at), style="dim" if indent else ""), kind, detail)
    return grid


# --------------------------------------------------------------------------- history NODE


def history_view(site: Site, node: str, last: int, warn: Warn) -> RenderableType:
    """The node's newest ``last`` verdicts, actions and drains, newest first, one row each."""
    require_cluster_file(site)
    sync_drains(site, warn)
    entries = failures.node_history(site, node, last + 1)  # one more: are there older ones?
    if not entries:
        return Text(f"{node}: nothing recorded in {site.name} (corectl health records verdicts)")
    shown = entries[:last]
    more = f" (older ones: --last {last * 2})" if len(entries) > last else ""
    title = Text(f"{node} in {site.name}: {len(shown)} verdicts, actions and drains, newest first{more}", style="bold")
    return Group(title, entries_grid(shown))


# --------------------------------------------------------------------------- rma


def rma(
    site: Site, now: datetime, warn: Warn, count: int | None = None, days: int | None = None
) -> tuple[Offenders, list[RmaCase]]:
    """The RMA report by the given rule, else the site's (group_vars)."""
    require_cluster_file(site)
    sync_drains(site, warn)
    return failures.rma_report(site, *thresholds(site, count, days), now)


def rma_view(site: Site, offenders: Offenders, cases: list[RmaCase]) -> RenderableType:
    """The nodes to send back, most failures first, each with its evidence newest first."""
    scope = rule(offenders.failures, offenders.days)
    if not cases:
        return Text(f"RMA: no candidate in {site.name} (no node with {scope})")
    parts: list[RenderableType] = [
        Text(f"RMA: {counted(len(cases), 'candidate')} in {site.name} ({scope})", style="bold")
    ]
    for case in cases:
        parts.append(Text.assemble((case.node, "bold red"), f": {counted(case.count, 'failure')}"))
        parts.append(entries_grid(case.evidence(), indent=2))
    return Group(*parts)


def _entry_json(entry: Entry) -> dict[str, Any]:
    if isinstance(entry, Verdict):
        checks = [{"name": c.name, "message": c.message} for c in entry.failed]
        return {"at": entry.at, "run_id": entry.run_id, "checks": checks}
    if isinstance(entry, Drain):
        return {"at": entry.at, "until": entry.until, "state": entry.state, "user": entry.user, "reason": entry.reason}
    return {"at": entry.at, "action": entry.action, "outcome": entry.outcome, "detail": entry.detail}


def rma_json(site: Site, offenders: Offenders, cases: list[RmaCase]) -> dict[str, Any]:
    """``{site, failures, days, since, until, nodes: [{node, failures, evidence, actions}]}``."""
    return {
        "site": site.name,
        "failures": offenders.failures,
        "days": offenders.days,
        "since": offenders.since,
        "until": offenders.until,
        "nodes": [
            {
                "node": case.node,
                "failures": case.count,
                "evidence": [_entry_json(v) for v in case.failures],
                "drains": [_entry_json(d) for d in case.drains],
                "actions": [_entry_json(a) for a in case.actions],
            }
            for case in cases
        ],
    }


# --------------------------------------------------------------------------- report


def report(site: Site, now: datetime, days: int, warn: Warn) -> tuple[Reliability, dict[str, Any]]:
    """The reliability figures of the ``days`` days up to ``now``, and the health checks' order and
    thresholds they were judged by."""
    require_cluster_file(site)
    sync_drains(site, warn)
    since, until = failures.window(days, now)
    computes = [node.name for node in load_cluster(site.directory).nodes if "compute" in node.roles]
    evidence = failures.window_evidence(site, since, until)
    figures = reliability(computes, evidence, parse_stamp(since), parse_stamp(until))
    return figures, {"checks": list(CHECK_ORDER[2:]), "thresholds": health_thresholds(site)}


def health_thresholds(site: Site) -> dict[str, Any]:
    """The node_health role's numeric settings as the site's runs get them: the role's defaults, then
    group_vars (a value computed per node from cluster.yml, its profile and fabric: "per node")."""
    defaults = yaml.safe_load((site.root / "roles" / "node_health" / "defaults" / "main.yml").read_text()) or {}
    values = {**defaults, **groupvars.all_vars(site)}
    return {
        key: value if is_number(value) else "per node"
        for key, value in sorted(values.items())
        if key.startswith("node_health_") and (is_number(value) or (isinstance(value, str) and "{{" in value))
    }


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def hours(value: timedelta | None) -> str:
    return "-" if value is None else f"{value / timedelta(hours=1):.2f} h"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def _row(f: Figures, *, availability: bool) -> list[str]:
    cells = [f.name, str(f.failures), hours(f.mtbf), hours(f.mttr)]
    return [*cells, percent(f.availability) if availability else f"{f.per_1000_node_days:.2f}"]


def report_view(site: Site, figures: Reliability, judged: dict[str, Any]) -> RenderableType:
    """The fleet's figures, then by class and by node; the checks and thresholds at the end."""
    fleet = figures.fleet
    assert fleet is not None
    span = figures.until - figures.since
    title = Text(
        f"reliability of {site.name}, {shown_time(failures.stamp(figures.since))} to "
        f"{shown_time(failures.stamp(figures.until))} ({span / timedelta(days=1):g} days, "
        f"{counted(figures.node_count, 'node')})",
        style="bold",
    )
    summary = Text(
        f"all nodes: {counted(fleet.failures, 'failure')}, MTBF {hours(fleet.mtbf)}, MTTR {hours(fleet.mttr)}, "
        f"availability {percent(fleet.availability)}, {fleet.per_1000_node_days:.2f} failures per 1,000 node-days"
    )
    parts: list[RenderableType] = [title, summary]
    if figures.classes:
        by_class = Table("class", "failures", "MTBF", "MTTR", "per 1,000 node-days", title="by failure class")
        for cls in figures.classes:
            by_class.add_row(*_row(cls, availability=False))
        parts.append(by_class)
    by_node = Table("node", "failures", "MTBF", "MTTR", "availability", title="by node")
    for node in figures.nodes:
        by_node.add_row(*_row(node, availability=True))
    parts.append(by_node)
    thresholds = ", ".join(f"{key.removeprefix('node_health_')} {value}" for key, value in judged["thresholds"].items())
    parts.append(Text(f"checks, in order: {', '.join(judged['checks'])}", style="dim"))
    parts.append(Text(f"thresholds: {thresholds}", style="dim"))
    return Group(*parts)


def _figures_json(f: Figures) -> dict[str, Any]:
    def seconds(value: timedelta | None) -> float | None:
        return None if value is None else value.total_seconds()

    return {
        "name": f.name,
        "failures": f.failures,
        "repaired": f.repaired,
        "down_s": f.down.total_seconds(),
        "mtbf_s": seconds(f.mtbf),
        "mttr_s": seconds(f.mttr),
        "availability": f.availability,
        "failures_per_1000_node_days": f.per_1000_node_days,
    }


def report_json(site: Site, figures: Reliability, judged: dict[str, Any]) -> dict[str, Any]:
    """``{site, since, until, nodes: N, fleet, classes, by_node, checks, thresholds}``."""
    assert figures.fleet is not None
    return {
        "site": site.name,
        "since": failures.stamp(figures.since),
        "until": failures.stamp(figures.until),
        "node_count": figures.node_count,
        "fleet": _figures_json(figures.fleet),
        "classes": [_figures_json(c) for c in figures.classes],
        "by_node": [_figures_json(n) for n in figures.nodes],
        **judged,
    }

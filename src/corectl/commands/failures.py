"""history NODE, rma and report: a node's verdicts, actions and drains, the nodes to send back, and the
reliability figures of a period (corectl.health.failures, corectl.health.reliability) with its usage,
utilisation and nodes out of service (corectl.health.usage_read), in the terminal, as JSON or as one HTML
page (corectl.health.page).

Both first copy the drains and downs Slurm's accounting recorded (whoever made them: Slurm's health
program, heal, an operator, an upgrade) from the controller into the history; a controller that
cannot be read is warned about, and the history is shown as kept. The repeat-offender rule comes
from group_vars (``corectl_repeat_offender_failures`` failures in ``corectl_repeat_offender_days``
days; group_vars/all/health.yml, a site overrides it in its own group_vars); ``corectl rma
--failures/--days`` override it for one report. A failure is a failing health run or a failure
drain, each failure counted once (corectl.health.drains.failure_count); planned drains count nowhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corectl.errors import CorectlError
from corectl.health import failures
from corectl.health.coverage import SparesPeriod, capacity_line, cover_cells, spares_period
from corectl.health.failures import Action, Drain, Entry, Offenders, RmaCase, Verdict, rule, thresholds
from corectl.health.page import report_page, utilisation_line
from corectl.health.reliability import Figures, Outage, Reliability, figure_cells, hours, outages, percent, reliability
from corectl.health.report import CHECK_ORDER, failed_checks
from corectl.health.stamps import epoch_stamp
from corectl.health.usage import Share, UsageRead
from corectl.health.usage_read import read_usage
from corectl.site import Site, groupvars, require_cluster_file
from corectl.site.context import Context
from corectl.slurm import NodeEvent, SlurmStatus, SpareEvent, read_slurm_status
from corectl.store import parse_stamp
from corectl.words import counted

Warn = Callable[[str], None]


def slurm_read(ctx: Context, warn: Warn, days: int = 30) -> SlurmStatus:
    """Slurm's state with the drains and downs of the last ``days`` days its accounting holds and the spares'
    history (read on the controller), shown with the history; a controller that cannot be read: ``warn``, and
    none (the history as kept)."""
    try:
        return read_slurm_status(ctx, event_days=days)
    except CorectlError as exc:
        warn(f"warning: Slurm's drains not read, the history is shown as kept: {exc}")
        return SlurmStatus()


def slurm_events(ctx: Context, warn: Warn, days: int = 30) -> list[NodeEvent]:
    return slurm_read(ctx, warn, days).events


# corectl-spares' events (corectl.slurm.SpareEvent) as the history names them
SPARE_ACTIONS = {"held": "held as spare", "swap": "spare in", "spare": "held as spare", "back": "spare back",
                 "short": "no spare", "released": "spare released"}  # fmt: skip


def spare_actions(events: list[SpareEvent], node: str) -> list[Action]:
    """The spares' changes that concern ``node`` (it entered, was held, or was covered), as actions."""
    return [
        Action(node, epoch_stamp(e.at), SPARE_ACTIONS.get(e.event, f"spare {e.event}"), "ok", e.message)
        for e in events
        if node in (e.node, e.covered)
    ]


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


def history_view(ctx: Context, node: str, last: int, warn: Warn) -> RenderableType:
    """The node's newest ``last`` verdicts, actions and drains, newest first, one row each."""
    site = ctx.site
    require_cluster_file(site)
    slurm = slurm_read(ctx, warn)
    entries = failures.node_history(site, node, last + 1, slurm.events)  # one more: are there older ones?
    entries = failures.newest_first([*entries, *spare_actions(slurm.spare_events, node)])[: last + 1]
    if not entries:
        return Text(f"{node}: nothing recorded in {site.name} (corectl health records verdicts)")
    shown = entries[:last]
    more = f" (older ones: --last {last * 2})" if len(entries) > last else ""
    title = Text(f"{node} in {site.name}: {len(shown)} verdicts, actions and drains, newest first{more}", style="bold")
    return Group(title, entries_grid(shown))


# --------------------------------------------------------------------------- rma


def rma(
    ctx: Context, now: datetime, warn: Warn, count: int | None = None, days: int | None = None
) -> tuple[Offenders, list[RmaCase]]:
    """The RMA report by the given rule, else the site's (group_vars)."""
    require_cluster_file(ctx.site)
    failures_, days_ = thresholds(ctx.site, count, days)
    return failures.rma_report(ctx.site, failures_, days_, now, slurm_events(ctx, warn, days_))


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


def report(ctx: Context, now: datetime, days: int, warn: Warn) -> tuple[Reliability, dict[str, Any], Period]:
    """The reliability figures of the ``days`` days up to ``now``, the health checks' order and thresholds they
    were judged by, and the period's outages, usage and utilisation."""
    site = ctx.site
    require_cluster_file(site)
    since, until = failures.window(days, now)
    slurm = slurm_read(ctx, warn, days)
    evidence = failures.window_evidence(site, since, until, slurm.events)
    computes = [node.name for node in ctx.cluster.nodes if "compute" in node.roles]
    figures = reliability(computes, evidence, parse_stamp(since), parse_stamp(until))
    judged = {"checks": list(CHECK_ORDER[2:]), "thresholds": health_thresholds(site)}
    gone = outages(evidence, figures.since, figures.until)
    pool = sum(len(p.spare_names()) for p in ctx.cluster.config.slurm.partitions)
    spares = (
        spares_period(gone, slurm.spare_events, len(computes), pool, figures.since, figures.until)
        if pool or slurm.spare_events
        else None
    )
    return figures, judged, Period(gone, read_usage(ctx, figures.since, figures.until), spares)


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


@dataclass(frozen=True)
class Period:
    """What the report shows beside the figures: the nodes out of service (the failure history) and
    the usage and utilisation the head answered (or why not)."""

    outages: list[Outage]
    read: UsageRead
    spares: SparesPeriod | None = None  # a site with spare pools (or a history of them)


def check_html_path(path: Path) -> None:
    """Refuse, before anything is read, an --html path that cannot be written (one line, exit 2)."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        why = "a directory" if path.is_dir() else f"{folder} is not a writable directory"
        raise CorectlError(f"--html {path}: {why}", exit_code=2)


def write_html(site: Site, figures: Reliability, of: Period, path: Path, made: datetime) -> None:
    """The report as one self-contained HTML page at ``path``; a path that cannot be written: a one-line
    error (exit 2)."""
    page = report_page(site.name, figures, of.outages, of.read, made, of.spares)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise CorectlError(f"--html {path}: {exc.strerror or exc}", exit_code=2) from None


def _shares_table(what: str, shares: list[Share]) -> Table:
    table = Table(what, "jobs", "GPU-hours", title=f"GPU-hours by {what}")
    for share in shares:
        table.add_row(Text(share.name), f"{share.jobs:,}", f"{share.gpu_hours:,.2f}")  # names: no markup
    return table


def period_view(of: Period) -> list[RenderableType]:
    """The usage tables, the utilisation line and the nodes out of service, for the terminal."""
    parts: list[RenderableType] = []
    used = of.read.usage
    if used is None:
        parts.append(Text(of.read.usage_note, style="yellow"))
    else:
        parts.append(Text(f"usage: {counted(used.jobs, 'job')}, {used.gpu_hours:,.2f} GPU-hours", style="bold"))
        if used.accounts:
            parts += [_shares_table("account", used.accounts), _shares_table("user", used.users)]
    series = of.read.utilisation
    parts.append(
        Text(of.read.utilisation_note, style="yellow")
        if series is None
        else Text(f"utilisation: {utilisation_line(series)}")
    )
    if of.outages:
        table = Table("node", "from", "out", "cause", title="out of service (failure drains)")
        for o in of.outages:
            out = hours(o.end - o.start) + (", still" if o.open else "")
            table.add_row(o.node, shown_time(failures.stamp(o.start)), out, Text(o.cls))
        parts.append(table)
    else:
        parts.append(Text("out of service: no node (no failure drain in the period)"))
    if of.spares is not None:
        parts.append(Text(capacity_line(of.spares, _shown)))
        if of.spares.covers:
            table = Table("node", "failed", "spare", "covered after", "repaired after", title="failures and spares")
            for cover in of.spares.covers:
                table.add_row(*cover_cells(cover, _shown))
            parts.append(table)
    return parts


def _shown(at: datetime) -> str:
    return shown_time(failures.stamp(at))


def period_json(of: Period) -> dict[str, Any]:
    """``{usage: {jobs, gpu_hours, accounts, users} | null, usage_note, utilisation: {...} | null,
    utilisation_note, out_of_service: [...]}``."""
    used, series = of.read.usage, of.read.utilisation

    def shares(items: list[Share]) -> list[dict[str, Any]]:
        return [{"name": s.name, "jobs": s.jobs, "gpu_hours": s.gpu_hours} for s in items]

    return {
        "usage": None
        if used is None
        else {
            "jobs": used.jobs,
            "gpu_hours": used.gpu_hours,
            "accounts": shares(used.accounts),
            "users": shares(used.users),
        },
        "usage_note": of.read.usage_note,
        "utilisation": None
        if series is None
        else {"times": series.times, "util_percent": series.util, "gpus_busy": series.busy, "gpus": series.gpus},
        "utilisation_note": of.read.utilisation_note,
        "out_of_service": [
            {
                "node": o.node,
                "from": failures.stamp(o.start),
                "until": failures.stamp(o.end),
                "still": o.open,
                "cause": o.cls,
                "reason": o.reason,
            }
            for o in of.outages
        ],
        "spares": None if of.spares is None else of.spares.as_json(),
    }


def report_view(site: Site, figures: Reliability, judged: dict[str, Any], of: Period | None = None) -> RenderableType:
    """The fleet's figures, then by class and by node; the checks and thresholds at the end."""
    fleet = figures.fleet
    assert fleet is not None
    span = figures.until - figures.since
    title = Text(
        f"reliability of {site.name}, {shown_time(failures.stamp(figures.since))} to "
        f"{shown_time(failures.stamp(figures.until))} ({counted(round(span / timedelta(days=1)), 'day')}, "
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
            by_class.add_row(*figure_cells(cls, availability=False))
        parts.append(by_class)
    by_node = Table("node", "failures", "MTBF", "MTTR", "availability", title="by node")
    for node in figures.nodes:
        by_node.add_row(*figure_cells(node, availability=True))
    parts.append(by_node)
    thresholds = ", ".join(f"{key.removeprefix('node_health_')} {value}" for key, value in judged["thresholds"].items())
    parts.append(Text(f"checks, in order: {', '.join(judged['checks'])}", style="dim"))
    parts.append(Text(f"thresholds: {thresholds}", style="dim"))
    if of is not None:
        parts += period_view(of)
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


def report_json(site: Site, figures: Reliability, judged: dict[str, Any], of: Period | None = None) -> dict[str, Any]:
    """``{site, since, until, nodes: N, fleet, classes, by_node, checks, thresholds}``, and the period's
    usage, utilisation and nodes out of service (period_json) when given."""
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
        **(period_json(of) if of is not None else {}),
    }

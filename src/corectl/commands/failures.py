"""history NODE and rma: a node's verdicts, actions and drains, and the nodes to send back (corectl.health.failures).

Both first copy the drains and downs Slurm's accounting recorded (whoever made them: Slurm's health
program, heal, an operator, an upgrade) from the controller into the history; a controller that
cannot be read is warned about, and the history is shown as kept. The repeat-offender rule comes
from group_vars (``corectl_repeat_offender_failures`` failures in ``corectl_repeat_offender_days``
days; group_vars/all/health.yml, a site overrides it in its own group_vars); ``corectl rma
--failures/--days`` override it for one report. A failure is a failing health run or a failure
drain, each failure counted once (corectl.health.failures.failure_count); planned drains count nowhere.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corectl.errors import CorectlError
from corectl.health import failures
from corectl.health.failures import Action, Drain, Entry, Offenders, RmaCase, Verdict, rule, thresholds
from corectl.health.report import failed_checks
from corectl.site import Site, require_cluster_file
from corectl.site.inventory import render_site
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
    kind = Text(drain.state.rstrip("*+") or "DRAIN", style="bold red" if drain.failure else "dim")
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

"""history NODE and rma: a node's verdicts and actions, and the nodes to send back (corectl.health.failures).

The repeat-offender rule comes from group_vars (``corectl_repeat_offender_failures`` failing health
runs in ``corectl_repeat_offender_days`` days; group_vars/all/health.yml, a site overrides it in
its own group_vars); ``corectl rma --failures/--days`` override it for one report.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corectl.health import failures
from corectl.health.failures import Action, Entry, Offenders, RmaCase, Verdict, rule, thresholds
from corectl.health.report import failed_checks
from corectl.site import Site, require_cluster_file
from corectl.words import counted


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


def entries_grid(entries: list[Entry], indent: int = 0) -> Table:
    """One row per entry: its time and kind (never cut), then what it said (wrapped beside them)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column()
    for entry in entries:
        kind, detail = _verdict_cells(entry) if isinstance(entry, Verdict) else _action_cells(entry)
        grid.add_row(Text(" " * indent + shown_time(entry.at), style="dim" if indent else ""), kind, detail)
    return grid


# --------------------------------------------------------------------------- history NODE


def history_view(site: Site, node: str, last: int) -> RenderableType:
    """The node's newest ``last`` verdicts and actions, newest first, one row each."""
    require_cluster_file(site)
    entries = failures.node_history(site, node, last + 1)  # one more: are there older ones?
    if not entries:
        return Text(f"{node}: no verdict or action recorded in {site.name} (corectl health records them)")
    shown = entries[:last]
    more = f" (older ones: --last {last * 2})" if len(entries) > last else ""
    title = Text(f"{node} in {site.name}: {len(shown)} verdicts and actions, newest first{more}", style="bold")
    return Group(title, entries_grid(shown))


# --------------------------------------------------------------------------- rma


def rma(
    site: Site, now: datetime, count: int | None = None, days: int | None = None
) -> tuple[Offenders, list[RmaCase]]:
    """The RMA report by the given rule, else the site's (group_vars)."""
    require_cluster_file(site)
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
        parts.append(Text.assemble((case.node, "bold red"), f": {counted(len(case.failures), 'failing health run')}"))
        parts.append(entries_grid(case.evidence(), indent=2))
    return Group(*parts)


def _entry_json(entry: Entry) -> dict[str, Any]:
    if isinstance(entry, Verdict):
        checks = [{"name": c.name, "message": c.message} for c in entry.failed]
        return {"at": entry.at, "run_id": entry.run_id, "checks": checks}
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
                "failures": len(case.failures),
                "evidence": [_entry_json(v) for v in case.failures],
                "actions": [_entry_json(a) for a in case.actions],
            }
            for case in cases
        ],
    }

"""Commands that show the cluster's state: health, status, history, rma, report, logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from corectl.cli import options, policy
from corectl.cli.app import app, err, out
from corectl.cli.options import InventoryOpt, JsonOpt, LastOpt, LimitOpt, WaitOpt


@app.command()
def health(
    inventory: InventoryOpt = None,
    limit: LimitOpt = None,
    level: Annotated[
        int | None, typer.Option("--level", min=0, max=3, help="dcgmi diag level (0 off, 1-3); default: the nodes'")
    ] = None,
    json_out: JsonOpt = False,
    wide: Annotated[bool, typer.Option("--wide", help="the full node x check matrix instead of the summary")] = False,
    burn_in: Annotated[
        bool, typer.Option("--burn-in", help="NCCL all_reduce through Slurm instead, busbw vs the profile's")
    ] = False,
    wait: WaitOpt = 0,
) -> None:
    """Run the node health checks on compute nodes in parallel; exit 1 if any node fails. --burn-in resumes the
    nodes it tested and drains a slow one: it holds the site's lock, as every changing command does."""
    if burn_in:
        from corectl.commands.burnin import burn_in as run_burn_in

        with policy.changing(policy.site(inventory), wait) as ctx:
            results = run_burn_in(ctx, out, limit=limit)
        if any(r.status == "fail" for r in results):
            raise typer.Exit(1)
        return

    from corectl.commands.health import health as run_health

    if not run_health(policy.recording(inventory), out, err, limit=limit, level=level, json_out=json_out, wide=wide):
        raise typer.Exit(1)


@app.command()
def status(inventory: InventoryOpt = None) -> None:
    """Show compute nodes with their Slurm state, reason, running jobs, last health check and repeat offenders, and
    each partition's hot spares (held, and which spare serves for which failed node)."""
    from corectl.commands.status import status as site_status

    out.print(site_status(policy.reading(inventory), policy.warn))


@app.command("history")
def node_history(
    node: Annotated[str, typer.Argument(help="a node of the site, e.g. dgx07")],
    inventory: InventoryOpt = None,
    last: LastOpt = 20,
) -> None:
    """A node's health verdicts, remediation actions, drains (who drained it and why) and hot-spare swaps, newest
    first."""
    from corectl.commands.failures import history_view

    out.print(history_view(policy.reading(inventory), node, last, policy.warn))


@app.command()
def rma(
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    failures: Annotated[
        int | None,
        typer.Option(min=1, help="failures that make a repeat offender (default: group_vars, 3)"),
    ] = None,
    days: Annotated[int | None, options.days("in this many days up to now (default: group_vars, 7)")] = None,
) -> None:
    """Nodes to send back (repeat offenders: failing health runs and failure drains), with the evidence."""
    from datetime import UTC, datetime

    from corectl.commands.failures import rma as rma_report
    from corectl.commands.failures import rma_json, rma_view

    ctx = policy.reading(inventory)
    offenders, cases = rma_report(ctx, datetime.now(UTC), policy.warn, failures, days)
    if json_out:
        print(json.dumps(rma_json(ctx.site, offenders, cases), indent=2))
    else:
        out.print(rma_view(ctx.site, offenders, cases))


@app.command()
def report(
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    days: Annotated[int, options.days("the period: this many days up to now")] = 30,
    html: Annotated[
        Path | None,
        typer.Option("--html", metavar="FILE", help="also write the report as one HTML page with plots"),
    ] = None,
) -> None:
    """The period's report: GPU-hours and jobs per account and user, GPU utilisation, nodes out of service and
    why, the spares that covered them and the capacity, and the reliability figures (failures, MTBF, MTTR,
    availability per node and class)."""
    from datetime import UTC, datetime

    from corectl.commands.failures import check_html_path, report_json, report_view, write_html
    from corectl.commands.failures import report as reliability_report

    if html is not None:
        check_html_path(html)
    ctx = policy.reading(inventory)
    site = ctx.site
    now = datetime.now(UTC)
    figures, judged, of = reliability_report(ctx, now, days, policy.warn)
    if html is not None:
        write_html(site, figures, of, html, now)
    if json_out:
        print(json.dumps(report_json(site, figures, judged, of), indent=2))
    else:
        out.print(report_view(site, figures, judged, of))
        if html is not None:
            out.print(f"report written to {html}")


@app.command("logs")
def node_logs(
    node: Annotated[str, typer.Argument(help="a node of the site, e.g. dgx07 (up or down)")],
    inventory: InventoryOpt = None,
    since: Annotated[str | None, typer.Option("--since", help="only the last 30m, 2h, 7d, ...")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="only lines matching this regular expression")] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="the newest this many (0: all)")] = 200,
) -> None:
    """Print a node's logs (its journal, kernel log included) as the log host keeps them: works for a node that
    is down or was power-cycled."""
    from corectl.commands.logs import logs as read_logs

    for line in read_logs(policy.reading(inventory), out, node, since, grep, lines):
        print(line)

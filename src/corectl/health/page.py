"""corectl report --html: the period's report as one self-contained HTML page (inline SVG plots from
corectl.health.charts and tables, no script, nothing loaded from elsewhere): GPU-hours and jobs per
account and user, GPU utilisation over time, nodes out of service and why, and the reliability figures.
Every text from the cluster is escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from html import escape

from corectl.health import charts
from corectl.health.coverage import SparesPeriod, capacity_line, cover_cells
from corectl.health.reliability import Outage, Reliability, figure_cells, hours, percent
from corectl.health.usage import Share, UsageRead, Utilisation
from corectl.words import counted

# Each series' colour (the screenshot test looks for them)
ACCOUNT_COLOUR = "#1f77b4"
USER_COLOUR = "#ff7f0e"
UTIL_COLOUR = "#2ca02c"
BUSY_COLOUR = "#9467bd"
# the causes' colours: none of the series' above, no grey (the axes and grid are grey), each distinct, enough for
# every check corectl's health names and Slurm's own reasons before one repeats
CAUSE_COLOURS = (
    "#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
    "#ff9896", "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5",
)  # fmt: skip

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 960px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
p.note { color: #a33; } p.dim { color: #666; font-size: 12px; }
"""


def clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table of escaped cells; the columns in ``numeric`` right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i in numeric else ''}>{escape(c)}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def cause_colours(causes: Iterable[str]) -> dict[str, str]:
    """Each cause (failure class) its colour, the causes in name order."""
    return {cause: CAUSE_COLOURS[i % len(CAUSE_COLOURS)] for i, cause in enumerate(sorted(set(causes)))}


def _usage(read: UsageRead) -> list[str]:
    parts = ["<h2>GPU-hours and jobs</h2>"]
    if read.usage is None:
        return [*parts, f'<p class="note">{escape(read.usage_note)}</p>']
    used = read.usage
    parts.append(f"<p>{used.jobs:,} jobs, {used.gpu_hours:,.2f} GPU-hours in the period.</p>")
    for what, shares, colour in (("account", used.accounts, ACCOUNT_COLOUR), ("user", used.users, USER_COLOUR)):
        parts.append(charts.bar_chart(f"GPU-hours per {what}", [(s.name, s.gpu_hours) for s in shares], colour, "h"))
        parts.append(table((what, "jobs", "GPU-hours"), _share_rows(shares), numeric=(1, 2)))
    return parts


def _share_rows(shares: Sequence[Share]) -> list[list[str]]:
    return [[s.name, f"{s.jobs:,}", f"{s.gpu_hours:,.2f}"] for s in shares]


def utilisation_line(series: Utilisation) -> str:
    """``mean GPU utilisation 42.5% (200 samples), at most 12 of 16 GPUs in use``."""
    if not series.times:
        return "no utilisation sample in the period"
    mean = series.mean_util or 0.0
    return (
        f"mean GPU utilisation {mean:.1f}% ({len(series.times)} samples), "
        f"at most {series.peak_busy} of {series.most_gpus} GPUs in use"
    )


def _utilisation(read: UsageRead, since: datetime, until: datetime) -> list[str]:
    parts = ["<h2>GPU utilisation</h2>"]
    series = read.utilisation
    if series is None:
        return [*parts, f'<p class="note">{escape(read.utilisation_note)}</p>']
    parts.append(f"<p>{escape(utilisation_line(series))}.</p>")
    util = charts.Line("mean GPU utilisation", UTIL_COLOUR, series.util)
    parts.append(charts.line_chart("GPU utilisation (%)", series.times, [util], since, until, 100, "%"))
    busy = charts.Line("GPUs in use by jobs", BUSY_COLOUR, series.busy)
    top = max(series.most_gpus, series.peak_busy, 1)
    parts.append(charts.line_chart("GPUs in use", series.times, [busy], since, until, top, ""))
    return parts


def _outages(outages: Sequence[Outage], since: datetime, until: datetime) -> list[str]:
    colours = cause_colours(o.cls for o in outages)
    rows = sorted({o.node for o in outages})
    spans = [
        charts.Span(o.node, o.start, o.end, colours[o.cls], f"{o.node} {clock(o.start)} to {clock(o.end)}: {o.reason}")
        for o in outages
    ]
    parts = ["<h2>Nodes out of service and why</h2>"]
    parts.append(charts.timeline("Failure drains per node", rows, spans, since, until, colours))
    cells = [
        [o.node, clock(o.start), "still" if o.open else clock(o.end), hours(o.end - o.start), o.cls, o.reason]
        for o in outages
    ]
    if cells:
        parts.append(table(("node", "from", "to", "out", "cause", "reason"), cells, numeric=(3,)))
    return parts


def _reliability(figures: Reliability) -> list[str]:
    fleet = figures.fleet
    assert fleet is not None
    parts = ["<h2>Reliability</h2>"]
    parts.append(
        f"<p>All nodes: {fleet.failures} failures, MTBF {hours(fleet.mtbf)}, MTTR {hours(fleet.mttr)}, "
        f"availability {percent(fleet.availability)}, {fleet.per_1000_node_days:.2f} failures per 1,000 node-days.</p>"
    )
    if figures.classes:
        rows = [figure_cells(c, availability=False) for c in figures.classes]
        parts.append(table(("class", "failures", "MTBF", "MTTR", "per 1,000 node-days"), rows, numeric=(1, 2, 3, 4)))
    rows = [figure_cells(n, availability=True) for n in figures.nodes]
    parts.append(table(("node", "failures", "MTBF", "MTTR", "availability"), rows, numeric=(1, 2, 3, 4)))
    return parts


def _spares(of: SparesPeriod | None) -> list[str]:
    if of is None:
        return []
    parts = ["<h2>Spares and capacity</h2>", f"<p>{escape(capacity_line(of, clock))}.</p>"]
    rows = [cover_cells(c, clock) for c in of.covers]
    if rows:
        parts.append(table(("node", "failed", "spare", "covered after", "repaired after"), rows, numeric=(3, 4)))
    return parts


def report_page(
    site: str, figures: Reliability, outages: Sequence[Outage], read: UsageRead, made: datetime,
    spares: SparesPeriod | None = None,
) -> str:  # fmt: skip
    """The whole page."""
    since, until = figures.since, figures.until
    title = f"{site}: {clock(since)} to {clock(until)}"
    days = counted(round((until - since) / timedelta(days=1)), "day")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>corectl report {escape(title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Report of {escape(title)}</h1>",
        f'<p class="dim">{days}, {counted(figures.node_count, "node")}; '
        f"made {escape(clock(made))} by corectl report.</p>",
        *_usage(read),
        *_utilisation(read, since, until),
        *_outages(outages, since, until),
        *_spares(spares),
        *_reliability(figures),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"

"""The report's plots as inline SVG, written here (no plotting library, no script): horizontal bars, lines
over time and a timeline of spans per row. Every text from the cluster is escaped; shapes are drawn with
crisp edges, so that each series' colour is exact on screen (the screenshot test finds it there)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

WIDTH = 900
LABEL_CHARS = 28  # a label longer than this is cut, with an ellipsis
AXIS = "#888888"
GRID = "#dddddd"
FONT = 'font-family="sans-serif" font-size="12" fill="#222222"'


@dataclass(frozen=True)
class Line:
    """One series of a line chart: its name, colour and values (one per time)."""

    name: str
    colour: str
    values: Sequence[float]


@dataclass(frozen=True)
class Span:
    """One bar of a timeline: its row, start and end, colour, and what hovering it says."""

    row: str
    start: datetime
    end: datetime
    colour: str
    tip: str


def short(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _svg(height: int, title: str, body: list[str]) -> str:
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" shape-rendering="crispEdges" role="img" aria-label="{escape(title)}">'
    )
    heading = f'<text x="0" y="16" {FONT} font-weight="bold">{escape(title)}</text>'
    return "\n".join([head, f"<title>{escape(title)}</title>", heading, *body, "</svg>"])


def _text(x: float, y: float, text: str, anchor: str = "start") -> str:
    return f'<text x="{x:.0f}" y="{y:.0f}" text-anchor="{anchor}" {FONT}>{escape(text)}</text>'


def bar_chart(title: str, bars: Sequence[tuple[str, float]], colour: str, unit: str) -> str:
    """One horizontal bar per (label, value), its length proportional to the value (the largest spans
    the plot), the value written after it."""
    label_w, value_w, top, row_h, bar_h = 220, 130, 30, 28, 20
    plot_w = WIDTH - label_w - value_w
    if not bars:
        return _svg(top + 24, title, [_text(0, top + 14, "nothing in the period")])
    peak = max(value for _, value in bars) or 1.0
    body = [f'<line x1="{label_w}" y1="{top - 4}" x2="{label_w}" y2="{top + row_h * len(bars)}" stroke="{AXIS}"/>']
    for i, (label, value) in enumerate(bars):
        y = top + i * row_h
        width = round(plot_w * max(value, 0.0) / peak)
        body.append(_text(label_w - 8, y + 15, short(label), "end"))
        body.append(
            f'<rect x="{label_w + 1}" y="{y}" width="{width}" height="{bar_h}" fill="{colour}">'
            f"<title>{escape(label)}: {value:.2f} {escape(unit)}</title></rect>"
        )
        body.append(_text(label_w + width + 8, y + 15, f"{value:,.2f} {unit}"))
    return _svg(top + row_h * len(bars) + 8, title, body)


def _clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%m-%d %H:%M")


def _time_axis(since: datetime, until: datetime, left: int, plot_w: int, top: int, bottom: int) -> list[str]:
    """Five time ticks (UTC) under a plot from ``top`` to ``bottom``, with grid lines."""
    body = []
    for i in range(5):
        x = left + plot_w * i / 4
        at = since + (until - since) * i / 4
        body.append(f'<line x1="{x:.0f}" y1="{top}" x2="{x:.0f}" y2="{bottom}" stroke="{GRID}"/>')
        body.append(_text(x, bottom + 16, _clock(at), "middle"))
    return body


LEGEND_LINE = 18  # px between the lines of a legend that wraps


def _legend(items: Sequence[tuple[str, str]], title: str) -> tuple[list[str], int]:
    """The legend's swatches and names in their order, beside the title on its line and on more lines
    below it when they do not fit there, each line right-aligned; and how many lines it took."""
    lines: list[list[tuple[str, str, int]]] = [[]]
    room = WIDTH - 10 - (8 * len(title) + 20)  # right of the bold title, with space to spare
    for name, colour in items:
        label = short(name, 40)
        width = 7 * len(label) + 24
        if lines[-1] and width > room:
            lines.append([])
            room = WIDTH - 10
        lines[-1].append((label, colour, width))
        room -= width
    body = []
    for n, line in enumerate(lines):
        x, y = WIDTH - 10 - sum(width for *_, width in line), 16 + LEGEND_LINE * n
        for label, colour, width in line:
            body.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{colour}"/>')
            body.append(_text(x + 16, y, label))
            x += width
    return body, len(lines)


# a series of at most this many samples gets a dot on each (one sample draws no line)
MARKERS_UP_TO = 60


def line_chart(
    title: str,
    times: Sequence[int],
    lines: Sequence[Line],
    since: datetime,
    until: datetime,
    top_value: float,
    unit: str,
) -> str:
    """Each line over the period (times: epoch seconds), from 0 to ``top_value`` upwards."""
    left, right, top, plot_h = 70, 40, 34, 200
    plot_w = WIDTH - left - right
    bottom = top + plot_h
    body = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="{AXIS}"/>']
    body += _time_axis(since, until, left, plot_w, top, bottom)
    peak = top_value if top_value > 0 else 1.0
    for value in (0.0, peak / 2, peak):
        y = bottom - plot_h * value / peak
        body.append(_text(left - 6, y + 4, f"{value:g} {unit}", "end"))
    body += _legend([(line.name, line.colour) for line in lines], title)[0]
    start, span = since.timestamp(), max((until - since).total_seconds(), 1.0)
    if not times:
        body.append(_text(left + 10, top + 20, "no samples in the period"))
    for line in lines:
        xy = [
            (
                left + plot_w * min(max((t - start) / span, 0.0), 1.0),
                bottom - 1 - (plot_h - 2) * min(max(v / peak, 0.0), 1.0),
            )
            for t, v in zip(times, line.values, strict=True)
        ]
        if xy:
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            body.append(
                f'<polyline points="{points}" fill="none" stroke="{line.colour}" stroke-width="3">'
                f"<title>{escape(line.name)}</title></polyline>"
            )
        if len(xy) <= MARKERS_UP_TO:  # a few samples (a young cluster, a short period): each one seen
            body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{line.colour}"/>' for x, y in xy]
    return _svg(bottom + 26, title, body)


def _lanes(bars: Sequence[tuple[int, int]]) -> list[int]:
    """A lane for each (x0, x1) bar of one row, bars in order of x0, so that no two bars of a lane share
    a pixel: a short outage beside another one stays visible on a lane of its own, not under it."""
    ends: list[int] = []  # where each lane's last bar ends
    lanes = []
    for x0, x1 in bars:
        lane = next((i for i, end in enumerate(ends) if end <= x0), len(ends))
        if lane == len(ends):
            ends.append(x1)
        else:
            ends[lane] = x1
        lanes.append(lane)
    return lanes


def timeline(
    title: str, rows: Sequence[str], spans: Sequence[Span], since: datetime, until: datetime, legend: dict[str, str]
) -> str:
    """One row per name (more than one lane where its bars would cover each other at this scale), a bar
    per span over the period (clipped to it, at least 2 px wide), a legend of the colours."""
    left, right, row_h, bar_h = 140, 40, 26, 18
    plot_w = WIDTH - left - right
    if not rows:
        return _svg(34 + 24, title, [_text(0, 34 + 14, "no node out of service in the period")])
    key, lines = _legend(list(legend.items()), title)
    top = 34 + LEGEND_LINE * (lines - 1)
    start, span = since.timestamp(), max((until - since).total_seconds(), 1.0)

    def x(at: datetime) -> int:
        return round(left + plot_w * min(max((at.timestamp() - start) / span, 0.0), 1.0))

    placed: dict[str, list[tuple[int, int, Span]]] = {row: [] for row in rows}
    for item in sorted(spans, key=lambda s: (s.start, s.end)):
        x0 = x(item.start)
        placed[item.row].append((x0, max(x(item.end), x0 + 2), item))
    drawn, offset = [], {}
    y = top
    for row in rows:
        lanes = _lanes([(x0, x1) for x0, x1, _ in placed[row]])
        offset[row] = y
        for lane, (x0, x1, item) in zip(lanes, placed[row], strict=True):
            at = y + lane * row_h + (row_h - bar_h) // 2
            drawn.append(
                f'<rect x="{x0}" y="{at}" width="{x1 - x0}" height="{bar_h}" fill="{item.colour}">'
                f"<title>{escape(item.tip)}</title></rect>"
            )
        y += row_h * max(lanes, default=0) + row_h
    bottom = y
    body = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{bottom - top}" fill="none" stroke="{AXIS}"/>']
    body += _time_axis(since, until, left, plot_w, top, bottom)
    body += key
    body += [_text(left - 8, offset[row] + 17, short(row, 18), "end") for row in rows]
    body += [  # a rule between one node's lanes and the next node's
        f'<line x1="{left}" y1="{offset[row]}" x2="{left + plot_w}" y2="{offset[row]}" stroke="{GRID}"/>'
        for row in rows[1:]
    ]
    body += drawn
    return _svg(bottom + 26, title, body)

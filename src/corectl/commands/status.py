"""status: every compute node's Slurm state, reason, running jobs and last health verdict, as one view."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from corectl import hostlist
from corectl.health.failures import Offenders, rule, site_offenders
from corectl.health.report import last_verdicts, verdict_failed
from corectl.health.stamps import epoch_stamp
from corectl.site.context import Context
from corectl.slurm import SlurmStatus, read_slurm_status
from corectl.words import counted


def is_quiet(status: SlurmStatus, node: str, health: dict[str, str], busy: set[str]) -> bool:
    """Idle, no reason, no job, and its last health check passed (or it was never checked)."""
    return status.states[node].quiet and node not in busy and not verdict_failed(health.get(node))


def status_summary(status: SlurmStatus, health: dict[str, str]) -> Text:
    """``1,000 nodes: 995 idle, 3 drain, 2 down; health failed on 3``."""
    counts = Counter(state for state, _ in status.states.values())
    by_count = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = Text(f"{counted(len(status.states), 'node')}: " + ", ".join(f"{n:,} {state}" for state, n in by_count))
    failing = sum(1 for node in status.states if verdict_failed(health.get(node)))
    if failing:
        text.append(f"; health failed on {failing:,}", style="red")
    return text


def quiet_line(names: list[str]) -> Text:
    """The quiet nodes as one Slurm host list; it wraps to a line of its own rather than being cut."""
    return Text.assemble(("idle and healthy", "green"), f" ({len(names):,}): ", hostlist.compress(names))


def spares_lines(status: SlurmStatus) -> list[Text]:
    """Each pool: ``spares of batch (1 of 1 held): dgx04; dgx03 in service for dgx01 since 2026-12-02 12:31:05Z``."""
    lines = []
    for pool in status.spares:
        held = hostlist.compress(pool.held) if pool.held else "none"
        line = Text(f"spares of {pool.partition} ({len(pool.held)} of {pool.size} held): {held}")
        for spare, failed in sorted(pool.covers.items()):
            swaps = [e.at for e in status.spare_events if e.event == "swap" and e.node == spare and e.covered == failed]
            since = f" since {epoch_stamp(swaps[-1]).replace('T', ' ')}" if swaps else ""
            line.append(f"; {spare} in service for {failed}{since}", style="yellow")
        lines.append(line)
    return lines


def spare_of(status: SlurmStatus) -> dict[str, str]:
    """Each held spare -> its partition."""
    return {node: pool.partition for pool in status.spares for node in pool.held}


def exceptions_table(status: SlurmStatus, names: list[str], health: dict[str, str]) -> Table:
    """One row per node that needs a look: node and state never cut, the rest wraps."""
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("node", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for column in ("reason", "jobs", "health"):
        table.add_column(column, overflow="fold")
    spares = spare_of(status)
    for node in names:
        state = status.states[node]
        verdict = health.get(node)
        bad = state.bad or verdict_failed(verdict)
        table.add_row(
            node,
            state.state,
            state.reason or (f"hot spare of {spares[node]}" if node in spares else ""),
            ", ".join(status.jobs_on(node)),
            verdict or "-",
            style="red" if bad else None,
        )
    return table


def offenders_line(offenders: Offenders, nodes: Iterable[str]) -> Text | None:
    """``repeat offenders (>=3 failures in 7 days): dgx07 (4), dgx12 (3)``, of ``nodes``."""
    known = set(nodes)
    named = [f"{node} ({count})" for node, count in offenders.counts.items() if node in known]
    if not named:
        return None
    return Text(f"repeat offenders ({rule(offenders.failures, offenders.days)}): {', '.join(named)}", style="yellow")


def status_table(
    status: SlurmStatus, health: dict[str, str] | None = None, offenders: Offenders | None = None
) -> Group:
    """A summary by state, the quiet nodes as one host list, the other nodes one per row, and the
    repeat offenders (``offenders``: corectl.health.failures.repeat_offenders) among them in one line."""
    health = health or {}
    if not status.states:
        return Group(Text("status: Slurm reported no compute nodes"))
    busy = status.busy_nodes()
    quiet: list[str] = []
    others: list[str] = []
    for node in sorted(status.states):
        (quiet if is_quiet(status, node, health, busy) else others).append(node)
    parts: list[RenderableType] = [status_summary(status, health)]
    if quiet:
        parts.append(quiet_line(quiet))
    if others:
        parts.append(exceptions_table(status, others, health))
    parts += spares_lines(status)
    repeat = offenders_line(offenders, status.states) if offenders else None
    if repeat:
        parts.append(repeat)
    return Group(*parts)


def status(ctx: Context, warn: Callable[[str], None]) -> Group:
    """Everything `corectl status` shows: Slurm's view read on the controller now, each node's last
    health verdict, and the repeat offenders, the drains Slurm recorded counted (a history that cannot be
    read: ``warn``, and none)."""
    slurm = read_slurm_status(ctx)
    offenders = site_offenders(ctx.site, datetime.now(UTC), warn, slurm.events)
    return status_table(slurm, last_verdicts(ctx.site), offenders)

"""power: status, on, off, soft and cycle through the nodes' BMCs, guarded against running jobs."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table
from rich.text import Text

from corectl.errors import CorectlError
from corectl.power import (
    ACTIONS,
    DESTRUCTIVE,
    PowerResult,
    apply,
    bmc_nodes,
    credentials,
    history_recorder,
    refusals,
)
from corectl.site.context import Context


def power(
    ctx: Context, action: str, expr: str, *, force: bool, timeout: float, warn: Callable[[str], None]
) -> list[PowerResult]:
    if action not in ("status", *ACTIONS):
        raise CorectlError(f"unknown power action '{action}' (status, {', '.join(ACTIONS)})", exit_code=2)
    site = ctx.site
    nodes = bmc_nodes(ctx.cluster, expr)
    if action in DESTRUCTIVE and not force:
        reasons = refusals(ctx, nodes)
        if reasons:
            raise CorectlError(f"power {action} refused: {'; '.join(reasons)}; drain first, or use --force")
    creds = credentials(site)
    record = None if action == "status" else history_recorder(site, warn)
    return apply(site, nodes, action, creds, timeout, record)


def power_table(action: str, results: list[PowerResult]) -> Table:
    table = Table(title=f"power {action}", title_justify="left", padding=(0, 1))
    table.add_column("node", no_wrap=True)
    table.add_column("power", no_wrap=True)
    table.add_column("result")
    for r in results:
        table.add_row(r.node, r.state, Text(r.detail or "ok", style="" if r.ok else "bold red"))
    return table

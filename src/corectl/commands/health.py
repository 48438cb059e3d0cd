"""health: run the node health checks and show the result."""

from __future__ import annotations

import json

from rich.console import Console

from corectl.health.report import health as run_checks
from corectl.health.report import health_json, render_report
from corectl.site.context import Context


def health(
    ctx: Context,
    out: Console,
    err: Console,
    *,
    limit: str | None = None,
    level: int | None = None,
    json_out: bool = False,
    wide: bool = False,
) -> bool:
    """Run the checks and print the summary (``wide``: the matrix; ``json_out``: JSON, with the
    progress on ``err``); whether every node passed."""
    result = run_checks(ctx, err if json_out else out, limit=limit, level=level)
    if json_out:
        print(json.dumps(health_json(result.nodes), indent=2))
    else:
        out.print(render_report(result.nodes, wide=wide))
    return result.ok

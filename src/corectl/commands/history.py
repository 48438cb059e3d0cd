"""runs: the site's past runs, read from the corectl.json each run leaves in .runs/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from corectl.site import Site


def load_runs(site: Site) -> list[dict[str, Any]]:
    records = []
    for path in sorted(site.runs_dir.glob("*/corectl.json")):
        try:
            records.append({**json.loads(path.read_text(encoding="utf-8")), "id": path.parent.name})
        except (OSError, json.JSONDecodeError):
            continue  # a run killed while writing its record
    return sorted(records, key=lambda r: (r.get("started", ""), r["id"]))


def _hosts(record: dict[str, Any], key: str) -> list[str]:
    return sorted(h for h, s in record.get("hosts", {}).items() if s.get(key))


def runs_table(site: Site, last: int) -> Table:
    table = Table(title=f"runs of {site.name} (newest last; artifacts in {Path(site.runs_dir)})", title_justify="left")
    for column in ("started", "command", "result", "s", "changed", "failed"):
        table.add_column(column)
    for record in load_runs(site)[-last:]:
        failed = sorted(set(_hosts(record, "failed")) | set(_hosts(record, "unreachable")))
        options = " ".join(f"--{key} {record[key]}" for key in ("limit", "tags") if record.get(key)) + (
            " --check" if record.get("check") else ""
        )
        changed = _hosts(record, "changed")
        table.add_row(
            str(record.get("started", "?")).replace("T", " ")[:19],
            f"{record.get('command', '?')} {options}".strip(),
            record.get("status", "?"),
            str(record.get("elapsed_s", "")),
            f"{len(changed)}: {', '.join(changed)}" if changed else "0",
            ", ".join(failed) or "-",
            style="red" if failed or record.get("status") != "successful" else "",
        )
    return table

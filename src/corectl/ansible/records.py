"""Run records read back from the site's store (corectl.store: the index corectl.ansible.runner adds each run's
record to; the run's folder under .runs/ keeps its artifacts until prune_runs removes it): for `corectl runs`,
for the expected length of the next like run (LiveProgress), and for whether the site has run before (a
replaced head's slurmctld waits for its saved state)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corectl import store
from corectl.ansible.events import converged_the_site
from corectl.ansible.progress import Expected
from corectl.site import Site


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None for one that is missing or cut short (a run killed while writing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def load_runs(site: Site) -> list[dict[str, Any]]:
    """Every run's record, oldest first, each with its id."""
    return store.runs(site)


def expected_from_history(
    site: Site, command: str, playbook: str, *, tags: str | None = None, check: bool = False
) -> Expected | None:
    """(tasks, seconds) of the newest successful run of the same command and playbook (and the
    same --tags and --check, which change what runs): LiveProgress's expected total."""
    for record in reversed(load_runs(site)):
        same = (record.get("command"), record.get("playbook"), record.get("tags"), bool(record.get("check")))
        if same == (command, playbook, tags, check) and record.get("status") == "successful" and record.get("tasks"):
            return int(record["tasks"]), float(record.get("elapsed_s") or 0.0)
    return None


def site_has_run(site: Site) -> bool:
    """Whether a run of site.yml (provision, add-node) on this site ever succeeded: the store's mark (set by the
    run, kept past the pruning of its folder), or a record of one in the index."""
    return store.marked(site, store.HAS_RUN) is not None or any(
        converged_the_site(r.get("playbook"), r.get("status"), r.get("check")) for r in load_runs(site)
    )

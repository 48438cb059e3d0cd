"""Run records: what each run leaves (corectl.json in its folder under .runs/, beside ansible-runner's artifacts,
and the same record in the site's store, corectl.store), the folders pruned to the newest KEEP_RUNS, and the
records read back: for `corectl runs`, for the expected length of the next like run (LiveProgress), and for
whether the site has run before (a replaced head's slurmctld waits for its saved state)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from corectl import store
from corectl.ansible.events import RunRequest, RunResult, converged_the_site
from corectl.files import atomic_write
from corectl.site import Site

KEEP_RUNS = 30
RUN_ID = re.compile(r"^\d{8}T\d{6}Z-(?P<pid>\d+)$")
Expected = tuple[int, float]  # a past run like this one: tasks it started, seconds it took


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


def accounting_has_run(site: Site) -> bool:
    """Whether a run of site.yml ever converged on the site's accounting database host (the store's mark)."""
    return store.marked(site, store.ACCOUNTING_HAS_RUN) is not None


def accounting_host(site: Site) -> str:
    """The host of the site's accounting database as the site's rendered settings name it ("" without one)."""
    try:
        settings = json.loads(site.site_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str((settings.get("corectl_slurm") or {}).get("dbd_host") or "")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def prune_runs(site: Site, keep: int = KEEP_RUNS) -> list[Path]:
    """Remove all but the newest ``keep`` finished runs, their folders and their rows in the store's index; a
    run still in progress is never removed.

    A run is in progress while it has no corectl.json and the process named in its id
    (<timestamp>-<pid>) is alive. Returns what was removed.
    """
    runs = sorted(p for p in site.runs_dir.iterdir() if p.is_dir() and RUN_ID.match(p.name))
    removed = []
    for run in runs[: max(0, len(runs) - keep)]:
        match = RUN_ID.match(run.name)
        assert match is not None
        if not (run / "corectl.json").is_file() and _pid_alive(int(match["pid"])):
            continue
        shutil.rmtree(run, ignore_errors=True)
        removed.append(run)
    store.forget_runs(site, [run.name for run in removed])
    return removed


def record(request: RunRequest, run: RunResult, started_at: str) -> None:
    """corectl.json beside ansible-runner's artifacts, the same record in the store's index (what `corectl runs`
    lists), and the store's has-run mark for a run that converged the site."""
    run.artifact_dir.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "command": request.command,
        "playbook": request.playbook,
        "limit": request.limit,
        "tags": request.tags,
        "check": request.check,
        "started": started_at,
        "elapsed_s": round(run.elapsed, 1),
        "status": run.status,
        "rc": run.rc,
        "tasks": run.tasks,
        "hosts": {host: asdict(stats) for host, stats in sorted(run.hosts.items())},
        "messages": dict(sorted(run.messages.items())),
    }
    if run.shards:
        data["shards"] = [asdict(shard) for shard in run.shards]
    if run.cpu:
        data["control_cpu_s"] = run.cpu
    if run.recorded:
        data["recorded"] = dict(sorted(run.recorded.items()))
    atomic_write(run.artifact_dir / "corectl.json", (json.dumps(data, indent=2) + "\n").encode(), 0o600)
    store.add_run(request.site, run.artifact_dir.name, data)  # the index `corectl runs` lists
    if converged_the_site(request.playbook, run.status, request.check):
        at = datetime.fromisoformat(started_at)
        store.mark(request.site, store.HAS_RUN, at, run.artifact_dir.name)
        dbd = accounting_host(request.site)
        if dbd and dbd in run.hosts:  # (a run limited to other hosts says nothing of the database)
            store.mark(request.site, store.ACCOUNTING_HAS_RUN, at, run.artifact_dir.name)

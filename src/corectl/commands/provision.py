"""provision: validate, render, run the site playbook with live progress, summarise."""

from __future__ import annotations

from rich.console import Console

from corectl import secrets
from corectl.commands.inventory import render_site
from corectl.progress import LiveProgress, summary_table
from corectl.runner import RunRequest, RunResult, run_playbook
from corectl.site import Site


def provision(
    site: Site,
    console: Console,
    *,
    limit: str | None = None,
    tags: str | None = None,
    check: bool = False,
    diff: bool = False,
    playbook: str = "site.yml",
    command: str = "provision",
) -> RunResult:
    render_site(site, check_only=False)
    secrets.check(site)  # a missing or placeholder secret stops the run before any node is touched
    request = RunRequest(site=site, playbook=playbook, command=command, limit=limit, tags=tags, check=check, diff=diff)
    with LiveProgress(console, f"{command} {site.name}") as progress:
        result = run_playbook(request, sink=progress)
    console.print(summary_table(result))
    totals = (
        f"changed={result.changed} failed={len(result.failed_hosts)} hosts={len(result.hosts)} "
        f"artifacts={result.artifact_dir}"
    )
    console.print(totals, highlight=False, soft_wrap=True)
    return result
